//! CronJob schedules, as upstream reads them (robfig/cron's `ParseStandard` and the CronJob's
//! `timeZone`): five fields or a descriptor (`@hourly`, `@daily`, ...), optionally behind a
//! `TZ=` or `CRON_TZ=` prefix. The fields are read by `croner`; zones come from jiff's time zone
//! database (the system's, or the one built in where a device has none).

use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};

/// A parsed schedule in its time zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: croner::Cron,
    zone: TimeZone,
}

/// The `TZ=<zone>` or `CRON_TZ=<zone>` prefix of a schedule, and the rest.
pub fn split_zone(schedule: &str) -> (Option<&str>, &str) {
    let schedule = schedule.trim();
    for prefix in ["CRON_TZ=", "TZ="] {
        if let Some(rest) = schedule.strip_prefix(prefix) {
            let (zone, fields) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            return (Some(zone), fields.trim());
        }
    }
    (None, schedule)
}

/// A time zone by its IANA name (`time.LoadLocation`); an empty name is UTC.
pub fn zone(name: &str) -> Result<TimeZone, String> {
    if name.is_empty() || name == "UTC" {
        return Ok(TimeZone::UTC);
    }
    TimeZone::get(name).map_err(|_| format!("unknown time zone {name}"))
}

impl Schedule {
    /// `schedule` in `time_zone` (the CronJob's `spec.timeZone`), else its own prefix's zone,
    /// else UTC (kube-controller-manager's local time, which is UTC on the machines it runs on).
    pub fn parse(schedule: &str, time_zone: Option<&str>) -> Result<Schedule, String> {
        let (prefix, fields) = split_zone(schedule);
        let zone = zone(time_zone.or(prefix).unwrap_or_default())?;
        if fields.starts_with("@every") {
            return Err("@every schedules are not supported; use the five cron fields".into());
        }
        // robfig/cron's descriptor that croner lacks.
        let fields = if fields.eq_ignore_ascii_case("@midnight") { "@daily" } else { fields };
        let parser = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Disallowed)
            .year(croner::parser::Year::Disallowed)
            .build();
        let cron = parser.parse(fields).map_err(|e| e.to_string())?;
        Ok(Schedule { cron, zone })
    }

    /// The first scheduled time after `after` (`Schedule.Next`).
    pub fn next(&self, after: Timestamp) -> Option<Timestamp> {
        let start = Zoned::new(after, self.zone.clone());
        self.cron.find_next_occurrence(&start, false).ok().map(|z| z.timestamp())
    }

    /// `t` in the schedule's zone, as RFC 3339 (the `cronjob-scheduled-timestamp` annotation).
    pub fn local(&self, t: Timestamp) -> String {
        let local = Zoned::new(t, self.zone.clone());
        // Go's RFC 3339 writes a zero offset as `Z`.
        if local.offset().seconds() == 0 {
            return local.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        }
        local.strftime("%Y-%m-%dT%H:%M:%S%:z").to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn five_fields_and_descriptors() {
        let every = Schedule::parse("*/1 * * * *", None).unwrap();
        assert_eq!(every.next(at("2026-01-01T10:00:30Z")), Some(at("2026-01-01T10:01:00Z")));
        let hourly = Schedule::parse("@hourly", None).unwrap();
        assert_eq!(hourly.next(at("2026-01-01T10:00:00Z")), Some(at("2026-01-01T11:00:00Z")));
        let midnight = Schedule::parse("@midnight", None).unwrap();
        assert_eq!(midnight.next(at("2026-01-01T10:00:00Z")), Some(at("2026-01-02T00:00:00Z")));
        let weekdays = Schedule::parse("30 9 * * MON-FRI", None).unwrap();
        assert_eq!(weekdays.next(at("2026-01-02T10:00:00Z")), Some(at("2026-01-05T09:30:00Z")), "Friday to Monday");
        assert!(Schedule::parse("0 0 * * * *", None).is_err(), "six fields");
        assert!(Schedule::parse("61 * * * *", None).is_err());
        assert!(Schedule::parse("not a schedule", None).is_err());
    }

    #[test]
    fn time_zones_move_the_wall_clock() {
        let berlin = Schedule::parse("0 9 * * *", Some("Europe/Berlin")).unwrap();
        assert_eq!(berlin.next(at("2026-01-01T00:00:00Z")), Some(at("2026-01-01T08:00:00Z")), "CET is UTC+1");
        assert_eq!(berlin.next(at("2026-07-01T00:00:00Z")), Some(at("2026-07-01T07:00:00Z")), "CEST is UTC+2");
        assert_eq!(berlin.local(at("2026-07-01T07:00:00Z")), "2026-07-01T09:00:00+02:00");
        let prefixed = Schedule::parse("CRON_TZ=Asia/Tokyo 0 9 * * *", None).unwrap();
        assert_eq!(
            prefixed.next(at("2026-01-01T00:00:00Z")),
            Some(at("2026-01-01T00:00:00Z").checked_add(jiff::SignedDuration::from_hours(24)).unwrap())
        );
        assert_eq!(split_zone("TZ=UTC 0 * * * *"), (Some("UTC"), "0 * * * *"));
        assert_eq!(zone("Mars/Olympus").unwrap_err(), "unknown time zone Mars/Olympus");
    }
}
