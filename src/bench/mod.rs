//! `cairn bench`: measurements reported in issue notes, run against a real server.

use anyhow::Result;
use clap::Args;

#[derive(Args, Debug)]
pub struct BenchArgs {}

pub fn run(_args: BenchArgs) -> Result<()> {
    anyhow::bail!("no benchmark selected")
}
