//! Resource quantities (`resource.Quantity`): parsing to milli-units and canonical form, as
//! apimachinery does.

use super::*;

pub(super) const QUANTITY_FORMAT_ERROR: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
pub(super) const QUANTITY_SUFFIX_ERROR: &str = "unable to parse quantity's suffix";
/// Quantities are capped at 2^63-1 units; kept here in milli-units.
pub(super) const MAX_MILLI: u128 = (i64::MAX as u128) * 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum QuantityFormat {
    BinarySI,
    DecimalSI,
    DecimalExponent,
}

/// Parses a quantity into milli-units (rounded up away from zero, as the API server does for
/// resource lists) and the suffix family that decides its canonical spelling.
pub(super) fn parse_quantity_full(input: &str) -> Result<(i128, QuantityFormat), &'static str> {
    let s = input.trim();
    if s.is_empty() {
        return Err(QUANTITY_FORMAT_ERROR);
    }
    let b = s.as_bytes();
    let mut pos = 0;
    let negative = b[0] == b'-';
    if b[0] == b'-' || b[0] == b'+' {
        pos = 1;
    }
    let int_start = pos;
    while pos < b.len() && b[pos].is_ascii_digit() {
        pos += 1;
    }
    let int_digits = &s[int_start..pos];
    let mut frac_digits = "";
    if pos < b.len() && b[pos] == b'.' {
        pos += 1;
        let frac_start = pos;
        while pos < b.len() && b[pos].is_ascii_digit() {
            pos += 1;
        }
        frac_digits = &s[frac_start..pos];
    }
    let suffix = &s[pos..];
    let mut i = 0;
    let sb = suffix.as_bytes();
    while i < sb.len() && b"eEinumkKMGTP".contains(&sb[i]) {
        i += 1;
    }
    if i < sb.len() && (sb[i] == b'-' || sb[i] == b'+') {
        i += 1;
    }
    while i < sb.len() && sb[i].is_ascii_digit() {
        i += 1;
    }
    if i != sb.len() {
        return Err(QUANTITY_FORMAT_ERROR);
    }
    let (dec_exp, bin_exp, format) = match suffix {
        "n" => (-9, 0, QuantityFormat::DecimalSI),
        "u" => (-6, 0, QuantityFormat::DecimalSI),
        "m" => (-3, 0, QuantityFormat::DecimalSI),
        "" => (0, 0, QuantityFormat::DecimalSI),
        "k" => (3, 0, QuantityFormat::DecimalSI),
        "M" => (6, 0, QuantityFormat::DecimalSI),
        "G" => (9, 0, QuantityFormat::DecimalSI),
        "T" => (12, 0, QuantityFormat::DecimalSI),
        "P" => (15, 0, QuantityFormat::DecimalSI),
        "E" => (18, 0, QuantityFormat::DecimalSI),
        "Ki" => (0, 1, QuantityFormat::BinarySI),
        "Mi" => (0, 2, QuantityFormat::BinarySI),
        "Gi" => (0, 3, QuantityFormat::BinarySI),
        "Ti" => (0, 4, QuantityFormat::BinarySI),
        "Pi" => (0, 5, QuantityFormat::BinarySI),
        "Ei" => (0, 6, QuantityFormat::BinarySI),
        s if s.len() > 1 && (s.starts_with('e') || s.starts_with('E')) => {
            let exp: i64 = s[1..].parse().map_err(|_| QUANTITY_SUFFIX_ERROR)?;
            (exp.clamp(-1000, 1000), 0, QuantityFormat::DecimalExponent)
        }
        _ => return Err(QUANTITY_SUFFIX_ERROR),
    };

    // Significant digits (at most 36 kept), a decimal shift and whether anything nonzero was dropped.
    let mut mantissa: u128 = 0;
    let mut kept = 0;
    let mut shift: i64 = 0;
    let mut sticky = false;
    for (digit, fractional) in
        int_digits.bytes().map(|d| (d - b'0', false)).chain(frac_digits.bytes().map(|d| (d - b'0', true)))
    {
        if kept < 36 {
            mantissa = mantissa * 10 + u128::from(digit);
            if mantissa > 0 {
                kept += 1;
            }
            if fractional {
                shift -= 1;
            }
        } else {
            sticky |= digit != 0;
            if !fractional {
                shift += 1;
            }
        }
    }
    let multiplier = 1024u128.pow(bin_exp);
    let p = shift + dec_exp + 3;
    let magnitude = if p >= 0 {
        u32::try_from(p)
            .ok()
            .and_then(|p| 10u128.checked_pow(p))
            .and_then(|scale| mantissa.checked_mul(scale))
            .and_then(|v| v.checked_mul(multiplier))
            .map_or(if mantissa == 0 { 0 } else { MAX_MILLI }, |v| v + u128::from(sticky))
    } else {
        let numerator = mantissa.checked_mul(multiplier);
        let denominator = u32::try_from(-p).ok().and_then(|q| 10u128.checked_pow(q));
        match (numerator, denominator) {
            (Some(n), Some(d)) => n / d + u128::from(n % d != 0 || sticky),
            (Some(n), None) => u128::from(n != 0 || sticky),
            _ => (mantissa as f64 * multiplier as f64 * 10f64.powi(p as i32)).ceil() as u128,
        }
    };
    let magnitude = magnitude.min(MAX_MILLI) as i128;
    Ok((if negative { -magnitude } else { magnitude }, format))
}

/// Parses a Kubernetes quantity (`100m`, `1Gi`, `2`, `1e3`, `0.5`) into milli-units, rounded
/// up away from zero to whole milli-units. `None` when the string is not a quantity.
pub fn parse_quantity(s: &str) -> Option<i128> {
    parse_quantity_full(s).ok().map(|(milli, _)| milli)
}

/// The canonical spelling the API server serializes a quantity with (`1.5Gi` → `1536Mi`,
/// `0.5` → `500m`, `1000m` → `1`).
pub fn canonical_quantity(s: &str) -> Option<String> {
    parse_quantity_full(s).ok().map(|(milli, format)| format_quantity(milli, format))
}

/// A count of bytes as the API writes a BinarySI quantity (`100Mi`, `204800Ki`, `1500k`).
pub fn binary_quantity(bytes: i128) -> String {
    format_quantity(bytes.saturating_mul(1000), QuantityFormat::BinarySI)
}

pub(super) fn format_quantity(milli: i128, format: QuantityFormat) -> String {
    if milli == 0 {
        return "0".to_string();
    }
    let sign = if milli < 0 { "-" } else { "" };
    let magnitude = milli.unsigned_abs();
    if format == QuantityFormat::BinarySI && magnitude >= 1_024_000 && magnitude.is_multiple_of(1000) {
        let mut n = magnitude / 1000;
        let mut exp = 0;
        while exp < 6 && n.is_multiple_of(1024) {
            n /= 1024;
            exp += 1;
        }
        return format!("{sign}{n}{}", ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][exp]);
    }
    let mut m = magnitude;
    let mut exp: i32 = -3;
    while m.is_multiple_of(10) {
        m /= 10;
        exp += 1;
    }
    match exp.rem_euclid(3) {
        1 => {
            m *= 10;
            exp -= 1;
        }
        2 => {
            m *= 100;
            exp -= 2;
        }
        _ => {}
    }
    let suffix = match (format, exp) {
        (QuantityFormat::DecimalExponent, 0) => String::new(),
        (QuantityFormat::DecimalExponent, e) => format!("e{e}"),
        (_, -3) => "m".to_string(),
        (_, 0) => String::new(),
        (_, 3) => "k".to_string(),
        (_, 6) => "M".to_string(),
        (_, 9) => "G".to_string(),
        (_, 12) => "T".to_string(),
        (_, 15) => "P".to_string(),
        (_, 18) => "E".to_string(),
        (_, e) => format!("e{e}"),
    };
    format!("{sign}{m}{suffix}")
}

pub(super) fn canonicalize(q: &mut Quantity) {
    if let Some(c) = canonical_quantity(&q.0) {
        q.0 = c;
    }
}

pub(super) fn canonicalize_list(list: &mut Option<Quantities>) {
    list.iter_mut().flat_map(|l| l.values_mut()).for_each(canonicalize);
}
