//! Exec sessions and the processes they start. When a streaming exec's client goes away (kubectl
//! killed, a dropped connection), containerd leaves the process running, and so does kubelet; cairn
//! ends it. Each session claims the exec process that appears in its container as it starts (the
//! new one running the session's command, or the only new one) and kills it if it still runs once
//! the session is over.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::runtime::tasks::{ExecProcess, Tasks};

/// How long a session's process has to appear after the session starts.
const CLAIM_WITHIN: Duration = Duration::from_secs(2);
const CLAIM_POLL: Duration = Duration::from_millis(25);

pub struct ExecSessions {
    tasks: Tasks,
    /// Exec IDs claimed by live sessions, and the sessions of each container still looking for
    /// their process.
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    claimed: HashSet<String>,
    starting: HashMap<String, usize>,
}

/// A session about to start in a container: what ran there before. While it lives, the session
/// counts as starting there.
pub struct Starting {
    sessions: Arc<ExecSessions>,
    container_id: String,
    before: HashSet<String>,
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Ok(mut state) = self.sessions.state.lock()
            && let Some(n) = state.starting.get_mut(&self.container_id)
        {
            *n -= 1;
            if *n == 0 {
                state.starting.remove(&self.container_id);
            }
        }
    }
}

impl ExecSessions {
    pub fn new(tasks: Tasks) -> Arc<Self> {
        Arc::new(ExecSessions { tasks, state: Mutex::new(State::default()) })
    }

    /// Notes what runs in the container before a session starts there; none when containerd
    /// cannot say, and then the session is not watched.
    pub async fn starting(self: &Arc<Self>, container_id: &str) -> Option<Starting> {
        let before = match self.tasks.exec_processes(container_id).await {
            Ok(p) => p.into_iter().map(|p| p.exec_id).collect(),
            Err(e) => {
                tracing::debug!("exec processes of {container_id}: {}", e.message());
                return None;
            }
        };
        *self.state.lock().ok()?.starting.entry(container_id.to_string()).or_default() += 1;
        Some(Starting { sessions: self.clone(), container_id: container_id.to_string(), before })
    }

    /// Claims the session's process, waits for the session to end, and kills the process if it
    /// still runs. `what` names the pod and container in the log.
    pub fn watch(self: Arc<Self>, starting: Starting, command: Vec<String>, what: String, session: JoinHandle<()>) {
        tokio::spawn(async move {
            let container_id = starting.container_id.clone();
            let mine = self.claim(&starting, &command, &session).await;
            drop(starting);
            let _ = session.await;
            let Some(mine) = mine else { return };
            let still = self.tasks.exec_processes(&container_id).await.unwrap_or_default();
            if still.iter().any(|p| p.exec_id == mine.exec_id) {
                match self.tasks.kill_exec(&container_id, &mine.exec_id).await {
                    Ok(()) => tracing::info!(
                        "exec session in {what} ended while {command:?} (pid {}) still ran: killed it",
                        mine.pid
                    ),
                    Err(e) => tracing::warn!("exec session in {what}: killing {command:?}: {}", e.message()),
                }
            }
            if let Ok(mut state) = self.state.lock() {
                state.claimed.remove(&mine.exec_id);
            }
        });
    }

    /// Polls until the process appears, [`CLAIM_WITHIN`] passes, or the session is over (then
    /// once more).
    async fn claim(&self, s: &Starting, command: &[String], session: &JoinHandle<()>) -> Option<ExecProcess> {
        let deadline = tokio::time::Instant::now() + CLAIM_WITHIN;
        while tokio::time::Instant::now() < deadline {
            let last = session.is_finished();
            let now = self.tasks.exec_processes(&s.container_id).await.ok()?;
            if let Some(p) = self.take_new(s, command, &now) {
                return Some(p);
            }
            if last {
                return None;
            }
            tokio::time::sleep(CLAIM_POLL).await;
        }
        None
    }

    /// Claims the new process running the session's command; failing that, the only new one,
    /// when no other session is starting in the container (a shell may have exec'd another
    /// program in its place).
    fn take_new(&self, s: &Starting, command: &[String], now: &[ExecProcess]) -> Option<ExecProcess> {
        let mut state = self.state.lock().ok()?;
        let new: Vec<&ExecProcess> =
            now.iter().filter(|p| !s.before.contains(&p.exec_id) && !state.claimed.contains(&p.exec_id)).collect();
        let alone = state.starting.get(&s.container_id).copied() == Some(1);
        let by_command = new.iter().find(|p| command_line(p.pid).as_deref() == Some(command));
        let p = by_command.or(new.first().filter(|_| new.len() == 1 && alone))?;
        state.claimed.insert(p.exec_id.clone());
        Some(ExecProcess::clone(p))
    }
}

/// A process's arguments, from the host's `/proc`.
fn command_line(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(id: &str, pid: u32) -> ExecProcess {
        ExecProcess { exec_id: id.into(), pid }
    }

    #[tokio::test]
    async fn a_session_claims_its_own_command_or_the_only_new_process() {
        let sessions = ExecSessions::new(Tasks::new(std::path::Path::new("/nonexistent.sock")));
        let starting = |before: &[&str]| {
            *sessions.state.lock().unwrap().starting.entry("c1".into()).or_default() += 1;
            Starting {
                sessions: sessions.clone(),
                container_id: "c1".into(),
                before: before.iter().map(|b| b.to_string()).collect(),
            }
        };
        // This test's own process stands for the session's command.
        let me = command_line(std::process::id()).unwrap();
        let other = u32::MAX;
        let a = starting(&["old"]);
        let now = [process("old", other), process("probe", other), process("mine", std::process::id())];
        assert_eq!(sessions.take_new(&a, &me, &now), Some(process("mine", std::process::id())));
        // Claimed once: a second session does not take it.
        let b = starting(&["old"]);
        assert_eq!(sessions.take_new(&b, &me, &now), None, "two sessions starting: no guessing");
        drop(a);
        // Alone, a session takes the only new process even if its command changed.
        assert_eq!(
            sessions.take_new(&b, &["sh".to_string()], &[process("old", other), process("x", other)]),
            Some(process("x", other))
        );
        drop(b);
        assert!(sessions.state.lock().unwrap().starting.is_empty());
    }
}
