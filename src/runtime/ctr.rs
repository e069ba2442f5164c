//! `cairn ctr`: a small crictl for nodes that have none. Lists pod sandboxes, containers and images
//! and prints container logs, straight from the CRI runtime.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context as _, Result};

use super::cri::{self, Cri};

/// What to show.
#[derive(Debug, Clone)]
pub enum Query {
    Pods,
    Containers {
        all: bool,
    },
    Images,
    Logs {
        id: String,
        tail: Option<usize>,
    },
    /// Runs a command in a container and prints its output.
    Exec {
        id: String,
        cmd: Vec<String>,
    },
}

pub async fn run(socket: &Path, query: Query) -> Result<String> {
    let cri = Cri::new(socket);
    let context = || format!("asking the runtime at {}", socket.display());
    match query {
        Query::Pods => {
            let pods = cri.list_pod_sandbox(Default::default()).await.with_context(context)?.items;
            let rows = pods.iter().map(|p| {
                let meta = p.metadata.clone().unwrap_or_default();
                let state = if p.state == cri::PodSandboxState::SandboxReady as i32 { "Ready" } else { "NotReady" };
                vec![short(&p.id), ago(p.created_at), state.into(), meta.name, meta.namespace, meta.attempt.to_string()]
            });
            Ok(table(&["POD ID", "CREATED", "STATE", "NAME", "NAMESPACE", "ATTEMPT"], rows))
        }
        Query::Containers { all } => {
            let filter = (!all).then(|| cri::ContainerFilter {
                state: Some(cri::ContainerStateValue { state: cri::ContainerState::ContainerRunning as i32 }),
                ..Default::default()
            });
            let list =
                cri.list_containers(cri::ListContainersRequest { filter }).await.with_context(context)?.containers;
            let rows = list.iter().map(|c| {
                let meta = c.metadata.clone().unwrap_or_default();
                let state = cri::ContainerState::try_from(c.state).map_or("Unknown", |s| match s {
                    cri::ContainerState::ContainerCreated => "Created",
                    cri::ContainerState::ContainerRunning => "Running",
                    cri::ContainerState::ContainerExited => "Exited",
                    cri::ContainerState::ContainerUnknown => "Unknown",
                });
                let image = c.image.as_ref().map(|i| i.image.clone()).unwrap_or_default();
                vec![
                    short(&c.id),
                    short(image.trim_start_matches("sha256:")),
                    ago(c.created_at),
                    state.into(),
                    meta.name,
                    meta.attempt.to_string(),
                    short(&c.pod_sandbox_id),
                ]
            });
            Ok(table(&["CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD ID"], rows))
        }
        Query::Images => {
            let images = cri.list_images(Default::default()).await.with_context(context)?.images;
            let mut rows = Vec::new();
            for image in &images {
                let id = short(image.id.trim_start_matches("sha256:"));
                let size = human_size(image.size);
                let tags = if image.repo_tags.is_empty() {
                    vec!["<none>:<none>".to_string()]
                } else {
                    image.repo_tags.clone()
                };
                for tag in tags {
                    let (repo, tag) =
                        tag.rsplit_once(':').filter(|(_, t)| !t.contains('/')).unwrap_or((&tag, "<none>"));
                    rows.push(vec![repo.to_string(), tag.to_string(), id.clone(), size.clone()]);
                }
            }
            Ok(table(&["IMAGE", "TAG", "IMAGE ID", "SIZE"], rows.into_iter()))
        }
        Query::Exec { id, cmd } => {
            let req = cri::ExecSyncRequest { container_id: id.clone(), cmd, timeout: 60 };
            let out = cri.exec_sync(req).await.with_context(|| format!("running a command in container {id}"))?;
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            if out.exit_code != 0 {
                anyhow::bail!("{text}the command exited with {}", out.exit_code);
            }
            Ok(text)
        }
        Query::Logs { id, tail } => {
            let status = cri
                .container_status(cri::ContainerStatusRequest { container_id: id.clone(), verbose: false })
                .await
                .with_context(context)?
                .status
                .with_context(|| format!("the runtime has no status for container {id}"))?;
            let bytes = std::fs::read(&status.log_path)
                .with_context(|| format!("reading the log {} of container {id}", status.log_path))?;
            let lines = log_messages(&String::from_utf8_lossy(&bytes));
            let skip = tail.map_or(0, |n| lines.len().saturating_sub(n));
            Ok(lines[skip..].iter().fold(String::new(), |mut out, l| {
                let _ = writeln!(out, "{l}");
                out
            }))
        }
    }
}

/// The messages of a CRI log file, whose lines are `<RFC3339 time> <stdout|stderr> <F|P> <text>`;
/// partial (`P`) lines are joined with what follows them.
pub fn log_messages(text: &str) -> Vec<String> {
    let mut messages = Vec::new();
    let mut partial = String::new();
    for line in text.lines() {
        let mut parts = line.splitn(4, ' ');
        let (Some(_time), Some(_stream), Some(tag)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        partial.push_str(parts.next().unwrap_or(""));
        if tag != "P" {
            messages.push(std::mem::take(&mut partial));
        }
    }
    if !partial.is_empty() {
        messages.push(partial);
    }
    messages
}

fn short(id: &str) -> String {
    id.chars().take(13).collect()
}

fn ago(created_ns: i64) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64);
    let secs = (now - created_ns).max(0) / 1_000_000_000;
    match secs {
        s if s < 60 => format!("{s}s ago"),
        s if s < 3600 => format!("{}m ago", s / 60),
        s if s < 86400 => format!("{}h ago", s / 3600),
        s => format!("{}d ago", s / 86400),
    }
}

fn human_size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1}GB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1}MB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1}kB", b as f64 / 1024.0),
        b => format!("{b}B"),
    }
}

/// Left-aligned columns separated by three spaces, as crictl prints them.
fn table(headers: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let rows: Vec<Vec<String>> = rows.collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = row.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        let _ = writeln!(out, "{}", line.join("   ").trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_lose_their_prefix_and_partials_join() {
        let log = "2026-11-30T04:00:00.1Z stdout F hello world\n\
                   garbage\n\
                   2026-11-30T04:00:00.2Z stderr F \n\
                   2026-11-30T04:00:00.3Z stdout P long \n\
                   2026-11-30T04:00:00.4Z stdout F line\n";
        assert_eq!(log_messages(log), ["hello world", "", "long line"]);
    }

    #[test]
    fn tables_align() {
        let out = table(&["A", "LONGER"], vec![vec!["xyz".into(), "1".into()]].into_iter());
        assert_eq!(out, "A     LONGER\nxyz   1\n");
        assert_eq!(human_size(1536), "1.5kB");
    }
}
