//! What the runtime says about one pod, and the API status kubelet derives from it
//! (`generateAPIPodStatus`, `convertToAPIContainerStatuses`, `getPhase`, the pod conditions).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
    Pod, PodCondition, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::runtime::cri;

/// CRI labels and annotations kubelet puts on sandboxes and containers.
pub mod keys {
    pub const POD_NAME: &str = "io.kubernetes.pod.name";
    pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
    pub const POD_UID: &str = "io.kubernetes.pod.uid";
    pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
    pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
    pub const RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
    pub const TERMINATION_GRACE: &str = "io.kubernetes.pod.terminationGracePeriod";
    pub const PRE_STOP: &str = "io.kubernetes.container.preStopHandler";
}

/// One container as the runtime reports it.
#[derive(Debug, Clone)]
pub struct RuntimeContainer {
    pub id: String,
    pub name: String,
    pub sandbox_id: String,
    pub restart_count: i32,
    pub hash: String,
    pub state: cri::ContainerState,
    /// `ContainerStatus`: exit code, reason, times, image reference.
    pub status: Option<cri::ContainerStatus>,
    pub annotations: HashMap<String, String>,
}

impl RuntimeContainer {
    pub fn running(&self) -> bool {
        self.state == cri::ContainerState::ContainerRunning
    }
    pub fn exited(&self) -> bool {
        self.state == cri::ContainerState::ContainerExited
    }
    pub fn exit_code(&self) -> Option<i32> {
        self.status.as_ref().filter(|_| self.exited()).map(|s| s.exit_code)
    }
    /// When the container exited (nanoseconds since the epoch).
    pub fn finished_at(&self) -> Option<i64> {
        self.status.as_ref().filter(|_| self.exited()).map(|s| s.finished_at)
    }
}

/// The runtime's view of one pod: sandboxes and containers, newest first.
#[derive(Debug, Clone, Default)]
pub struct RuntimePod {
    pub sandboxes: Vec<cri::PodSandbox>,
    pub containers: Vec<RuntimeContainer>,
}

impl RuntimePod {
    /// The containers of one name, newest first.
    pub fn of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a RuntimeContainer> + 'a {
        self.containers.iter().filter(move |c| c.name == name)
    }
    pub fn latest<'a>(&'a self, name: &'a str) -> Option<&'a RuntimeContainer> {
        self.of(name).next()
    }
    /// The containers of the newest sandbox (all of them when there is none).
    pub fn current(&self) -> impl Iterator<Item = &RuntimeContainer> {
        let sandbox = self.sandboxes.first().map(|s| s.id.as_str());
        self.containers.iter().filter(move |c| sandbox.is_none_or(|s| c.sandbox_id == s))
    }
    /// The newest container of one name in the newest sandbox.
    pub fn current_latest<'a>(&'a self, name: &'a str) -> Option<&'a RuntimeContainer> {
        self.current().find(|c| c.name == name)
    }
    /// The newest sandbox that is ready.
    pub fn ready_sandbox(&self) -> Option<&cri::PodSandbox> {
        self.sandboxes.iter().find(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
    }
    pub fn running(&self) -> impl Iterator<Item = &RuntimeContainer> {
        self.containers.iter().filter(|c| c.running())
    }
}

/// What the agent knows beyond the runtime, fed into the status.
#[derive(Debug)]
pub struct Inputs<'a> {
    /// Why a container is waiting (`CrashLoopBackOff`, `ErrImagePull`, ...) and the message.
    pub waiting: &'a HashMap<String, (String, String)>,
    /// Per container: (started, ready) from the probes; absent = no probe of that kind.
    pub probes: &'a HashMap<String, (Option<bool>, Option<bool>)>,
    pub pod_ips: &'a [String],
    pub host_ip: Option<&'a str>,
    pub sandbox_ready: bool,
    /// e.g. `containerd`, the prefix of container IDs.
    pub runtime_name: &'a str,
    /// Set when the pod was stopped for good (deleted, deadline, finished): the phase is terminal.
    pub terminal: Option<(&'a str, &'a str)>,
    /// Set when the node evicted the pod: the phase is `Failed`; with `true`, the message is that
    /// of its `DisruptionTarget` condition (reason `TerminationByKubelet`).
    pub evicted: Option<(&'a str, bool)>,
}

/// A CRI time (nanoseconds) as an API time, truncated to the second as Kubernetes serializes it.
pub fn time_from_ns(ns: i64) -> Option<Time> {
    (ns > 0).then(|| Timestamp::from_second(ns / 1_000_000_000).ok()).flatten().map(Time)
}

pub fn now() -> Time {
    Time(Timestamp::from_second(chrono::Utc::now().timestamp()).unwrap_or(Timestamp::UNIX_EPOCH))
}

fn restart_policy(pod: &Pod) -> &str {
    pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()).unwrap_or("Always")
}

/// Whether a container that exited with `code` is started again under the pod's restart policy
/// (a sidecar always is).
pub fn should_restart(pod: &Pod, container: &Container, code: i32) -> bool {
    match container.restart_policy.as_deref().unwrap_or(restart_policy(pod)) {
        "Always" => true,
        "OnFailure" => code != 0,
        _ => false,
    }
}

pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

fn terminated(c: &RuntimeContainer) -> Option<ContainerStateTerminated> {
    let s = c.status.as_ref()?;
    if !c.exited() {
        return None;
    }
    Some(ContainerStateTerminated {
        exit_code: s.exit_code,
        reason: Some(if s.reason.is_empty() {
            if s.exit_code == 0 { "Completed".into() } else { "Error".into() }
        } else {
            s.reason.clone()
        }),
        message: (!s.message.is_empty()).then(|| s.message.clone()),
        started_at: time_from_ns(s.started_at),
        finished_at: time_from_ns(s.finished_at),
        container_id: Some(String::new()),
        signal: None,
    })
}

fn state_of(c: &RuntimeContainer, runtime_name: &str) -> ContainerState {
    let mut t = terminated(c);
    if let Some(t) = &mut t {
        t.container_id = Some(format!("{runtime_name}://{}", c.id));
    }
    match (c.state, t) {
        (cri::ContainerState::ContainerRunning, _) => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: c.status.as_ref().and_then(|s| time_from_ns(s.started_at)),
            }),
            ..Default::default()
        },
        (_, Some(t)) => ContainerState { terminated: Some(t), ..Default::default() },
        _ => waiting("ContainerCreating", ""),
    }
}

fn waiting(reason: &str, message: &str) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.into()),
            message: (!message.is_empty()).then(|| message.into()),
        }),
        ..Default::default()
    }
}

/// One container's status. `default_waiting` is the reason shown before it ever ran
/// (`ContainerCreating`, or `PodInitializing` for app containers behind init containers).
fn container_status(spec: &Container, rt: &RuntimePod, inputs: &Inputs, default_waiting: &str) -> ContainerStatus {
    let mut all = rt.of(&spec.name);
    let latest = all.next();
    let previous = all.next();
    let mut status = ContainerStatus {
        name: spec.name.clone(),
        image: spec.image.clone().unwrap_or_default(),
        image_id: String::new(),
        ready: false,
        restart_count: 0,
        started: Some(false),
        state: Some(waiting(default_waiting, "")),
        last_state: Some(ContainerState::default()),
        ..Default::default()
    };
    let Some(latest) = latest else {
        if let Some((reason, message)) = inputs.waiting.get(&spec.name) {
            status.state = Some(waiting(reason, message));
        }
        return status;
    };
    status.container_id = Some(format!("{}://{}", inputs.runtime_name, latest.id));
    status.restart_count = latest.restart_count;
    if let Some(s) = &latest.status {
        if let Some(image) = s.image.as_ref().filter(|i| !i.image.is_empty()) {
            status.image = image.image.clone();
        }
        status.image_id = s.image_ref.clone();
    }
    let state = state_of(latest, inputs.runtime_name);
    let previous_state = previous.map(|p| state_of(p, inputs.runtime_name)).unwrap_or_default();
    let waiting_reason = inputs.waiting.get(&spec.name);
    if latest.running() {
        let (started, ready) = inputs.probes.get(&spec.name).copied().unwrap_or((None, None));
        let started = started.unwrap_or(true);
        status.started = Some(started);
        status.ready = started && ready.unwrap_or(true) && inputs.terminal.is_none();
        status.state = Some(state);
        status.last_state = Some(previous_state);
    } else if latest.exited()
        && inputs.terminal.is_none()
        && let Some((reason, message)) = waiting_reason
    {
        // Exited and waiting to be started again (CrashLoopBackOff, ...).
        status.state = Some(waiting(reason, message));
        status.last_state = Some(state);
    } else if latest.exited() {
        status.state = Some(state);
        status.last_state = Some(previous_state);
    } else {
        // Created, not started yet.
        let (reason, message) = waiting_reason.cloned().unwrap_or_else(|| ("ContainerCreating".into(), String::new()));
        status.state = Some(waiting(&reason, &message));
        status.last_state = Some(previous_state);
    }
    status
}

/// Whether init container `i` has done its part in the current sandbox: exited 0, or (a sidecar)
/// runs and has started, or was past already (a later container started; then it is only
/// restarted when it exits).
pub fn init_done(spec: &PodSpec, i: usize, rt: &RuntimePod, started: Option<bool>) -> bool {
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    let Some(c) = inits.get(i) else { return true };
    let mut runs = rt.current().filter(|x| x.name == c.name);
    if is_sidecar(c) {
        let later = |name: &str| inits[i + 1..].iter().chain(&spec.containers).any(|l| l.name == name);
        return runs.next().is_some_and(|l| l.running() && started.unwrap_or(true))
            || rt.current().any(|x| later(&x.name));
    }
    runs.any(|x| x.exit_code() == Some(0))
}

/// upstream `getPhase`.
fn phase(
    pod: &Pod,
    init: &[ContainerStatus],
    app: &[ContainerStatus],
    initialized: bool,
    terminal: bool,
) -> &'static str {
    let spec = pod.spec.as_ref();
    let policy = restart_policy(pod);
    let init_specs = spec.and_then(|s| s.init_containers.as_deref()).unwrap_or_default();
    if !initialized {
        // A regular init container that failed for good fails the pod.
        let failed = init.iter().zip(init_specs).any(|(s, c)| {
            !is_sidecar(c)
                && policy == "Never"
                && s.state.as_ref().and_then(|st| st.terminated.as_ref()).is_some_and(|t| t.exit_code != 0)
        });
        if failed {
            return "Failed";
        }
        if !terminal {
            return "Pending";
        }
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for s in app {
        let st = s.state.clone().unwrap_or_default();
        if st.running.is_some() {
            running += 1;
        } else if let Some(t) = &st.terminated {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if s.last_state.as_ref().and_then(|l| l.terminated.as_ref()).is_some() {
            stopped += 1;
        } else {
            waiting += 1;
        }
    }
    if terminal {
        return if !app.is_empty() && succeeded == app.len() { "Succeeded" } else { "Failed" };
    }
    if waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped > 0 {
        return match policy {
            "Always" => "Running",
            _ if stopped == succeeded => "Succeeded",
            "OnFailure" => "Running",
            _ => "Failed",
        };
    }
    "Pending"
}

fn condition(type_: &str, ok: bool, reason: Option<&str>, message: Option<String>) -> PodCondition {
    PodCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: if ok { None } else { reason.map(String::from) },
        message: if ok { None } else { message },
        ..Default::default()
    }
}

/// The pod's status from the runtime's view; conditions keep their transition times from `old`
/// when their status did not change, and conditions owned by others (PodScheduled, ...) are kept.
pub fn generate(pod: &Pod, rt: &RuntimePod, inputs: &Inputs) -> PodStatus {
    let spec = pod.spec.clone().unwrap_or_default();
    let old = pod.status.clone().unwrap_or_default();
    let init_specs = spec.init_containers.clone().unwrap_or_default();
    let mut init: Vec<ContainerStatus> =
        init_specs.iter().map(|c| container_status(c, rt, inputs, "PodInitializing")).collect();
    // A regular init container that completed is ready (upstream's prober marks it so).
    for (s, c) in init.iter_mut().zip(&init_specs) {
        if !is_sidecar(c) && s.state.as_ref().and_then(|st| st.terminated.as_ref()).is_some_and(|t| t.exit_code == 0) {
            s.ready = true;
        }
    }
    let done = |i: usize, c: &Container| init_done(&spec, i, rt, inputs.probes.get(&c.name).and_then(|p| p.0));
    let initialized = init_specs.iter().enumerate().all(|(i, c)| done(i, c));
    let app_default = if initialized { "ContainerCreating" } else { "PodInitializing" };
    let mut app: Vec<ContainerStatus> =
        spec.containers.iter().map(|c| container_status(c, rt, inputs, app_default)).collect();
    for s in &mut app {
        if !initialized && s.state.as_ref().is_some_and(|st| st.waiting.is_some()) && s.container_id.is_none() {
            s.state = Some(waiting("PodInitializing", ""));
        }
    }
    // Ephemeral containers are never ready and take no part in the phase or conditions.
    let ephemeral: Vec<ContainerStatus> = super::spec::ephemeral_containers(pod)
        .iter()
        .map(|(c, _)| ContainerStatus {
            ready: false,
            started: None,
            ..container_status(c, rt, inputs, "ContainerCreating")
        })
        .collect();
    let terminal = inputs.terminal.is_some();
    let phase = if inputs.evicted.is_some() { "Failed" } else { phase(pod, &init, &app, initialized, terminal) };

    let incomplete: Vec<&str> =
        init_specs.iter().enumerate().filter(|(i, c)| !done(*i, c)).map(|(_, c)| c.name.as_str()).collect();
    let unready: Vec<&str> = init
        .iter()
        .zip(&init_specs)
        .filter(|(_, c)| is_sidecar(c))
        .map(|(s, _)| s)
        .chain(&app)
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    // upstream `GeneratePod*Condition`: a Succeeded pod is "PodCompleted"; a pod that failed or
    // stopped lists its unready containers.
    let succeeded = phase == "Succeeded";
    let (ready_reason, unready_message) = if succeeded {
        ("PodCompleted", None)
    } else {
        ("ContainersNotReady", Some(format!("containers with unready status: [{}]", unready.join(" "))))
    };
    let ready = unready.is_empty() && !succeeded;
    let mut initialized_condition = condition(
        "Initialized",
        incomplete.is_empty() || succeeded,
        Some("ContainersNotInitialized"),
        Some(format!("containers with incomplete status: [{}]", incomplete.join(" "))),
    );
    if succeeded {
        initialized_condition.reason = Some("PodCompleted".into());
    }
    let old_conditions = old.conditions.clone().unwrap_or_default();
    let mut ready_condition = condition("Ready", ready, Some(ready_reason), unready_message.clone());
    if ready {
        // Readiness gates: conditions other components set must be True too.
        let gates = spec.readiness_gates.iter().flatten().map(|g| g.condition_type.as_str());
        let unmet: Vec<String> = gates
            .filter_map(|gate| match old_conditions.iter().find(|c| c.type_ == gate) {
                None => Some(format!("corresponding condition of pod readiness gate {gate:?} does not exist.")),
                Some(c) if c.status != "True" => {
                    Some(format!("the status of pod readiness gate {gate:?} is not \"True\", but {}", c.status))
                }
                Some(_) => None,
            })
            .collect();
        if !unmet.is_empty() {
            ready_condition = condition("Ready", false, Some("ReadinessGatesNotReady"), Some(unmet.join(", ")));
        }
    }
    let mut conditions = vec![
        condition("PodReadyToStartContainers", inputs.sandbox_ready, None, None),
        initialized_condition,
        ready_condition,
        condition("ContainersReady", ready, Some(ready_reason), unready_message),
    ];
    let now = now();
    for c in &mut conditions {
        let prev = old_conditions.iter().find(|o| o.type_ == c.type_);
        c.last_transition_time = match prev {
            Some(p) if p.status == c.status => p.last_transition_time.clone(),
            _ => Some(now.clone()),
        };
        c.last_probe_time = None;
    }
    // Keep conditions owned by others (PodScheduled, DisruptionTarget, readiness gates).
    let ours = ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady"];
    let mut all: Vec<PodCondition> =
        old_conditions.iter().filter(|c| !ours.contains(&c.type_.as_str())).cloned().collect();
    if let Some((message, true)) = inputs.evicted
        && !all.iter().any(|c| c.type_ == "DisruptionTarget" && c.status == "True")
    {
        all.retain(|c| c.type_ != "DisruptionTarget");
        all.push(PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("TerminationByKubelet".into()),
            message: Some(message.to_string()),
            last_transition_time: Some(now.clone()),
            ..Default::default()
        });
    }
    all.extend(conditions);

    let (reason, message) = match inputs.terminal {
        Some((reason, message)) if !reason.is_empty() => (Some(reason.to_string()), Some(message.to_string())),
        _ => (old.reason.clone().filter(|_| terminal), old.message.clone().filter(|_| terminal)),
    };
    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(all),
        container_statuses: Some(app),
        init_container_statuses: (!init.is_empty()).then_some(init),
        ephemeral_container_statuses: (!ephemeral.is_empty()).then_some(ephemeral),
        host_ip: inputs.host_ip.map(String::from).or(old.host_ip.clone()),
        host_ips: inputs
            .host_ip
            .map(|ip| vec![k8s_openapi::api::core::v1::HostIP { ip: ip.into() }])
            .or(old.host_ips.clone()),
        pod_ip: inputs.pod_ips.first().cloned().or_else(|| old.pod_ip.clone()),
        pod_ips: if inputs.pod_ips.is_empty() {
            old.pod_ips.clone()
        } else {
            Some(inputs.pod_ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect())
        },
        start_time: old.start_time.clone().or_else(|| Some(now.clone())),
        qos_class: old
            .qos_class
            .clone()
            .or_else(|| Some(crate::registry::kinds::pod_rules::qos_class(&spec).to_string())),
        nominated_node_name: old.nominated_node_name.clone(),
        reason,
        message,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "p", "namespace": "d", "uid": "u"}, "spec": spec}),
        )
        .unwrap()
    }

    fn container(name: &str, id: &str, rc: i32, state: cri::ContainerState, exit: i32) -> RuntimeContainer {
        RuntimeContainer {
            id: id.into(),
            name: name.into(),
            sandbox_id: "s".into(),
            restart_count: rc,
            hash: String::new(),
            state,
            status: Some(cri::ContainerStatus {
                id: id.into(),
                state: state as i32,
                started_at: 1_700_000_000_000_000_000,
                finished_at: if state == cri::ContainerState::ContainerExited { 1_700_000_005_000_000_000 } else { 0 },
                exit_code: exit,
                image_ref: "sha256:abc".into(),
                ..Default::default()
            }),
            annotations: HashMap::new(),
        }
    }

    fn ready_sandbox() -> cri::PodSandbox {
        cri::PodSandbox { id: "s".into(), state: cri::PodSandboxState::SandboxReady as i32, ..Default::default() }
    }

    fn generate_with(p: &Pod, rt: &RuntimePod, waiting: &HashMap<String, (String, String)>) -> PodStatus {
        let probes = HashMap::new();
        let ips = vec!["10.42.0.5".to_string()];
        let inputs = Inputs {
            waiting,
            probes: &probes,
            pod_ips: &ips,
            host_ip: Some("192.0.2.1"),
            sandbox_ready: rt.ready_sandbox().is_some(),
            runtime_name: "containerd",
            terminal: None,
            evicted: None,
        };
        generate(p, rt, &inputs)
    }

    fn cond<'a>(s: &'a PodStatus, t: &str) -> &'a PodCondition {
        s.conditions.as_ref().unwrap().iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn a_running_container_makes_a_ready_running_pod_and_a_second_round_changes_nothing() {
        let mut p = pod(serde_json::json!({"containers": [{"name": "c", "image": "busybox"}]}));
        let rt = RuntimePod {
            sandboxes: vec![ready_sandbox()],
            containers: vec![container("c", "id1", 0, cri::ContainerState::ContainerRunning, 0)],
        };
        let s = generate_with(&p, &rt, &HashMap::new());
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&s, "Ready").status, "True");
        assert_eq!(cond(&s, "PodReadyToStartContainers").status, "True");
        let c = &s.container_statuses.as_ref().unwrap()[0];
        assert!(c.ready && c.started == Some(true));
        assert_eq!(c.container_id.as_deref(), Some("containerd://id1"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.42.0.5"));
        // Fed its own output, the status is identical: nothing to write, no flapping timestamps.
        p.status = Some(s.clone());
        let again = generate_with(&p, &rt, &HashMap::new());
        assert_eq!(serde_json::to_value(&again).unwrap(), serde_json::to_value(&s).unwrap());
    }

    #[test]
    fn an_evicted_pod_fails_with_the_reason_and_a_disruption_condition_even_when_its_container_exited_0() {
        let p = pod(serde_json::json!({"containers": [{"name": "c", "image": "busybox"}]}));
        let rt = RuntimePod {
            sandboxes: vec![],
            containers: vec![container("c", "id1", 0, cri::ContainerState::ContainerExited, 0)],
        };
        let (probes, waiting) = (HashMap::new(), HashMap::new());
        let message = "The node was low on resource: memory. ";
        let inputs = Inputs {
            waiting: &waiting,
            probes: &probes,
            pod_ips: &[],
            host_ip: None,
            sandbox_ready: false,
            runtime_name: "containerd",
            terminal: Some(("Evicted", message)),
            evicted: Some((message, true)),
        };
        let s = generate(&p, &rt, &inputs);
        assert_eq!((s.phase.as_deref(), s.reason.as_deref()), (Some("Failed"), Some("Evicted")));
        assert_eq!(s.message.as_deref(), Some(message));
        let disruption = cond(&s, "DisruptionTarget");
        assert_eq!((disruption.status.as_str(), disruption.reason.as_deref()), ("True", Some("TerminationByKubelet")));
        assert_eq!(disruption.message.as_deref(), Some(message));
    }

    #[test]
    fn a_crash_looping_container_waits_with_its_last_run_as_last_state() {
        let p = pod(serde_json::json!({"containers": [{"name": "c", "image": "busybox"}]}));
        let rt = RuntimePod {
            sandboxes: vec![ready_sandbox()],
            containers: vec![
                container("c", "id2", 2, cri::ContainerState::ContainerExited, 3),
                container("c", "id1", 1, cri::ContainerState::ContainerExited, 3),
            ],
        };
        let waiting = HashMap::from([("c".to_string(), ("CrashLoopBackOff".to_string(), "back-off 20s".to_string()))]);
        let s = generate_with(&p, &rt, &waiting);
        assert_eq!(s.phase.as_deref(), Some("Running"), "restartPolicy Always keeps the pod Running");
        let c = &s.container_statuses.as_ref().unwrap()[0];
        assert_eq!(c.restart_count, 2);
        assert_eq!(c.state.as_ref().unwrap().waiting.as_ref().unwrap().reason.as_deref(), Some("CrashLoopBackOff"));
        let last = c.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!((last.exit_code, last.reason.as_deref()), (3, Some("Error")));
        assert_eq!(cond(&s, "Ready").reason.as_deref(), Some("ContainersNotReady"));
        assert_eq!(cond(&s, "Ready").message.as_deref(), Some("containers with unready status: [c]"));
    }

    #[test]
    fn restart_policy_never_ends_in_succeeded_or_failed() {
        for (exit, phase) in [(0, "Succeeded"), (1, "Failed")] {
            let p =
                pod(serde_json::json!({"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}));
            let rt = RuntimePod {
                sandboxes: vec![ready_sandbox()],
                containers: vec![container("c", "id1", 0, cri::ContainerState::ContainerExited, exit)],
            };
            let s = generate_with(&p, &rt, &HashMap::new());
            assert_eq!(s.phase.as_deref(), Some(phase));
            let reason = s.container_statuses.as_ref().unwrap()[0]
                .state
                .as_ref()
                .unwrap()
                .terminated
                .as_ref()
                .unwrap()
                .reason
                .clone();
            assert_eq!(reason.as_deref(), Some(if exit == 0 { "Completed" } else { "Error" }));
        }
    }

    #[test]
    fn init_containers_hold_the_app_containers_back() {
        let p = pod(serde_json::json!({
            "initContainers": [{"name": "i1", "image": "busybox"}, {"name": "i2", "image": "busybox"}],
            "containers": [{"name": "c", "image": "busybox"}]
        }));
        let rt = RuntimePod {
            sandboxes: vec![ready_sandbox()],
            containers: vec![
                container("i2", "b", 0, cri::ContainerState::ContainerRunning, 0),
                container("i1", "a", 0, cri::ContainerState::ContainerExited, 0),
            ],
        };
        let s = generate_with(&p, &rt, &HashMap::new());
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        assert_eq!(cond(&s, "Initialized").status, "False");
        assert_eq!(cond(&s, "Initialized").message.as_deref(), Some("containers with incomplete status: [i2]"));
        let app = &s.container_statuses.as_ref().unwrap()[0];
        assert_eq!(app.state.as_ref().unwrap().waiting.as_ref().unwrap().reason.as_deref(), Some("PodInitializing"));
        let spec = p.spec.as_ref().unwrap();
        assert!(init_done(spec, 0, &rt, None));
        assert!(!init_done(spec, 1, &rt, None));
    }
}
