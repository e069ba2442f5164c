//! The cairn binary a benchmark measures: `CAIRN_BENCH_BIN` when set (another build, so that a before
//! and an after binary are measured by the same benchmark in one sitting), else the one cargo built.

use std::path::PathBuf;

pub fn cairn_bin() -> PathBuf {
    std::env::var_os("CAIRN_BENCH_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_cairn")), PathBuf::from)
}
