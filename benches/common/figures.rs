//! How the benchmarks read their settings and report latencies.

#![allow(dead_code)]

use serde_json::{Value, json};

/// The environment variable `name` parsed, or `default` when it is unset or does not parse.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The `p`th percentile of sorted samples (nearest rank); `None` when there are none.
pub fn pct(sorted: &[f64], p: f64) -> Option<f64> {
    sorted.get(((sorted.len().max(1) - 1) as f64 * p / 100.0).round() as usize).copied()
}

/// Count, p50, p99 and max of latencies in milliseconds.
pub fn summary(mut ms: Vec<f64>) -> Value {
    ms.sort_by(f64::total_cmp);
    json!({"n": ms.len(), "p50_ms": pct(&ms, 50.0), "p99_ms": pct(&ms, 99.0), "max_ms": ms.last().copied()})
}
