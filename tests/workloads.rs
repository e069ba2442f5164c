//! End to end: Deployments, ReplicaSets, StatefulSets, DaemonSets, Jobs and CronJobs against the
//! real cairn, its embedded containerd and kubectl. Three nodes run side by side, each serving
//! several checks that work on their own objects. Deployments and Jobs: create, scale through the
//! scale subresource, set image, rollout status, history and undo, pause and resume, a
//! maxUnavailable 0 rollout sampled for ready pods, Recreate, refused pods, invalid specs; an
//! Indexed Job, a Job failing into its backoffLimit, ttlSecondsAfterFinished; and a rollout and a
//! Job that survive cairn being killed with SIGKILL half way (never more than maxSurge, no
//! completion lost or counted twice). StatefulSets (ordered start, stable claims, partitioned
//! updates, retention) and DaemonSets (taints, joining nodes, rolling update). A CronJob every
//! minute under Forbid, and `kubectl drain` held back by a PodDisruptionBudget.
//!
//! Needs root, containerd, runc and busybox-static (`.ci/run` installs them).

mod common;

#[path = "common/busybox.rs"]
mod busybox;
#[allow(dead_code)]
#[path = "../src/runtime/cri.rs"]
mod cri;
#[path = "common/node.rs"]
mod node;
#[allow(dead_code)]
#[path = "../src/runtime/oci_image.rs"]
mod oci_image;

use std::time::{Duration, Instant};

use busybox::BUSYBOX;
use common::{Server, eventually};
use node::{Node, node_ready};

const CIDR: &str = "10.47.0.0/16";
const BUSYBOX_2: &str = "docker.io/cairn-test/busybox:2";
/// A container command that ends on SIGTERM (a bare `sleep` as PID 1 would wait out the grace period).
const STOPS_ON_TERM: &str = "trap 'exit 0' TERM; sleep 3600 & wait";

/// `kubectl get <what> -o jsonpath=<path>`; `what` may carry flags (`rs -l app=web`).
fn get(node: &Server, what: &str, path: &str) -> String {
    let mut args: Vec<&str> = vec!["get"];
    args.extend(what.split_whitespace());
    let jsonpath = format!("jsonpath={path}");
    args.extend(["-o", &jsonpath]);
    let out = node.kubectl(&args);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn rollout_status(node: &Server, name: &str) -> String {
    let out = node.kubectl(&["rollout", "status", &format!("deployment/{name}"), "--timeout=90s"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "rollout of {name} did not finish: {text}{}\n{}\n--- server log ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        node.ok(&["get", "deploy,rs,pods", "-o", "wide"]),
        node.log()
    );
    text
}

/// Pods of a Deployment's selector: (all not being deleted, Ready ones).
fn pod_counts(node: &Server, selector: &str) -> (usize, usize) {
    let out = node.kubectl(&[
        "get",
        "pods",
        "-l",
        selector,
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.deletionTimestamp}|{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#,
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let live: Vec<&str> = text.lines().filter(|l| l.starts_with('|')).collect();
    (live.len(), live.iter().filter(|l| l.ends_with("True")).count())
}

/// Images of the pods of `selector` that are not being deleted.
fn live_images(node: &Server, selector: &str) -> String {
    let path = r#"{range .items[*]}{.metadata.deletionTimestamp}|{.spec.containers[0].image}{"\n"}{end}"#;
    let text = get(node, &format!("pods -l {selector}"), path);
    text.lines().filter_map(|l| l.strip_prefix('|')).collect::<Vec<_>>().join(" ")
}

fn image_of(node: &Server, name: &str) -> String {
    get(node, &format!("deploy/{name}"), "{.spec.template.spec.containers[0].image}")
}

fn check_create_scale_and_undo(node: &Server) {
    let out =
        node.ok(&["create", "deployment", "web", &format!("--image={BUSYBOX}"), "--", "/bin/sh", "-c", STOPS_ON_TERM]);
    assert_eq!(out.trim(), "deployment.apps/web created");
    assert!(rollout_status(node, "web").contains("deployment \"web\" successfully rolled out"));
    let table = node.ok(&["get", "deployment", "web"]);
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]);
    assert!(table.lines().nth(1).is_some_and(|l| l.split_whitespace().take(4).eq(["web", "1/1", "1", "1"])), "{table}");

    // One ReplicaSet `web-<hash>`, its pods labelled with the hash, the Deployment at revision 1.
    let rs = get(node, "rs -l app=web", "{.items[*].metadata.name}");
    let hash = get(node, "rs -l app=web", "{.items[0].metadata.labels.pod-template-hash}");
    assert_eq!(rs, format!("web-{hash}"));
    assert_eq!(get(node, "deploy/web", "{.metadata.annotations.deployment\\.kubernetes\\.io/revision}"), "1");
    let rs_table = node.ok(&["get", "rs", "-l", "app=web", "-o", "wide"]);
    assert!(
        rs_table.starts_with("NAME") && rs_table.contains("DESIRED") && rs_table.contains("SELECTOR"),
        "{rs_table}"
    );
    assert!(rs_table.contains(&format!("app=web,pod-template-hash={hash}")), "{rs_table}");

    // Scale 1 → 5 → 2 through the scale subresource.
    assert_eq!(node.ok(&["scale", "deployment/web", "--replicas=5"]).trim(), "deployment.apps/web scaled");
    rollout_status(node, "web");
    eventually(60, || (pod_counts(node, "app=web") == (5, 5)).then_some(()));
    assert_eq!(get(node, "deploy/web", "{.status.availableReplicas}"), "5");
    let scale = node.ok(&["get", "--raw", "/apis/apps/v1/namespaces/default/deployments/web/scale"]);
    let scale: serde_json::Value = serde_json::from_str(&scale).unwrap();
    assert_eq!((scale["kind"].as_str(), scale["spec"]["replicas"].as_i64()), (Some("Scale"), Some(5)));
    assert_eq!(scale["status"]["selector"], "app=web");
    node.ok(&["scale", "deployment/web", "--replicas=2"]);
    eventually(60, || (pod_counts(node, "app=web") == (2, 2)).then_some(()));
    eventually(30, || (get(node, "rs -l app=web", "{.items[0].status.replicas}") == "2").then_some(()));
    assert!(
        node.ok(&["get", "events", "--field-selector", "involvedObject.kind=ReplicaSet"]).contains("SuccessfulDelete")
    );

    // A new image rolls out through a second set; undo brings the first template back.
    node.ok(&["set", "image", "deployment/web", &format!("busybox={BUSYBOX_2}")]);
    rollout_status(node, "web");
    assert_eq!(live_images(node, "app=web"), format!("{BUSYBOX_2} {BUSYBOX_2}"));
    assert_eq!(get(node, "rs -l app=web", "{.items[*].spec.replicas}").split(' ').filter(|r| *r == "0").count(), 1);
    let history = node.ok(&["rollout", "history", "deployment/web"]);
    assert!(
        history.contains("REVISION")
            && history.lines().filter(|l| l.starts_with('1') || l.starts_with('2')).count() == 2,
        "{history}"
    );
    let events = node.ok(&["get", "events", "--field-selector", "involvedObject.name=web"]);
    assert!(events.contains("ScalingReplicaSet") && events.contains("Scaled up replica set web-"), "{events}");
    node.ok(&["rollout", "undo", "deployment/web"]);
    rollout_status(node, "web");
    assert_eq!(image_of(node, "web"), BUSYBOX);
    eventually(60, || (live_images(node, "app=web") == format!("{BUSYBOX} {BUSYBOX}")).then_some(()));
    assert_eq!(get(node, "deploy/web", "{.metadata.annotations.deployment\\.kubernetes\\.io/revision}"), "3");
    let first = format!("rs/web-{hash}");
    let history = get(node, &first, "{.metadata.annotations.deployment\\.kubernetes\\.io/revision-history}");
    assert_eq!(history, "1", "{}", node.ok(&["get", &first, "-o", "yaml"]));

    // Paused, a template change waits; resumed, it rolls out. A restart is a rollout too.
    node.ok(&["rollout", "pause", "deployment/web"]);
    eventually(30, || {
        (get(node, "deploy/web", r#"{.status.conditions[?(@.type=="Progressing")].reason}"#) == "DeploymentPaused")
            .then_some(())
    });
    node.ok(&["set", "env", "deployment/web", "MODE=paused"]);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        get(node, "rs -l app=web", "{.items[*].metadata.name}").split(' ').count(),
        2,
        "no new set while paused"
    );
    node.ok(&["rollout", "resume", "deployment/web"]);
    rollout_status(node, "web");
    assert_eq!(get(node, "rs -l app=web", "{.items[*].metadata.name}").split(' ').count(), 3);
    node.ok(&["rollout", "restart", "deployment/web"]);
    rollout_status(node, "web");
    assert_eq!(get(node, "deploy/web", "{.metadata.annotations.deployment\\.kubernetes\\.io/revision}"), "5");

    node.ok(&["delete", "deployment", "web"]);
    eventually(60, || {
        (get(node, "rs -l app=web", "{.items[*].metadata.name}").is_empty() && pod_counts(node, "app=web").0 == 0)
            .then_some(())
    });
}

fn deployment(name: &str, replicas: u32, surge: u32, unavailable: u32) -> String {
    deployment_with(name, replicas, surge, unavailable, 0)
}

/// A Deployment whose pods count as available `min_ready` seconds after they are ready.
fn deployment_with(name: &str, replicas: u32, surge: u32, unavailable: u32, min_ready: u32) -> String {
    format!(
        r#"{{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {{"name": "{name}"}},
  "spec": {{"replicas": {replicas}, "minReadySeconds": {min_ready}, "selector": {{"matchLabels": {{"app": "{name}"}}}},
    "strategy": {{"rollingUpdate": {{"maxSurge": {surge}, "maxUnavailable": {unavailable}}}}},
    "template": {{"metadata": {{"labels": {{"app": "{name}"}}}}, "spec": {{"terminationGracePeriodSeconds": 1,
      "containers": [{{"name": "main", "image": "{BUSYBOX}", "command": ["/bin/sh", "-c", "{STOPS_ON_TERM}"]}}]}}}}}}}}"#
    )
}

/// With maxUnavailable 0 the ready count never drops below `replicas` while the rollout runs.
fn check_max_unavailable_zero(node: &Server) {
    node.ok_stdin(&["apply", "-f", "-"], &deployment("steady", 3, 1, 0));
    rollout_status(node, "steady");
    node.ok(&["set", "image", "deployment/steady", &format!("main={BUSYBOX_2}")]);
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut samples = 0;
    loop {
        let (live, ready) = pod_counts(node, "app=steady");
        assert!(ready >= 3, "ready pods dropped to {ready} (of {live}) during a maxUnavailable 0 rollout");
        assert!(live <= 4, "{live} pods with maxSurge 1");
        samples += 1;
        let done =
            get(node, "deploy/steady", "{.status.updatedReplicas}/{.status.replicas}/{.status.availableReplicas}");
        if done == "3/3/3" && live_images(node, "app=steady").split(' ').all(|i| i == BUSYBOX_2) {
            break;
        }
        assert!(Instant::now() < deadline, "rollout did not finish: {done}");
    }
    assert!(samples > 3, "the rollout was sampled {samples} times");
    node.ok(&["delete", "deployment", "steady"]);
}

/// Recreate stops every old pod before the first new one starts.
fn check_recreate(node: &Server) {
    let spec = deployment("again", 2, 0, 1).replace(
        r#""strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}"#,
        r#""strategy": {"type": "Recreate"}"#,
    );
    node.ok_stdin(&["apply", "-f", "-"], &spec);
    rollout_status(node, "again");
    node.ok(&["set", "image", "deployment/again", &format!("main={BUSYBOX_2}")]);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let out = node.kubectl(&[
            "get",
            "pods",
            "-l",
            "app=again",
            "-o",
            r#"jsonpath={range .items[*]}{.spec.containers[0].image}|{.status.phase}{"\n"}{end}"#,
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let running = |image: &str| text.lines().any(|l| l == format!("{image}|Running"));
        assert!(!(running(BUSYBOX) && running(BUSYBOX_2)), "old and new pods ran side by side:\n{text}");
        if live_images(node, "app=again") == format!("{BUSYBOX_2} {BUSYBOX_2}")
            && get(node, "deploy/again", "{.status.availableReplicas}") == "2"
        {
            break;
        }
        assert!(Instant::now() < deadline, "Recreate did not finish:\n{text}");
    }
    node.ok(&["delete", "deployment", "again"]);
}

/// Pods the API refuses: `FailedCreate` events and a ReplicaFailure condition, retried with backoff.
fn check_refused_pods(node: &Server) {
    let spec = deployment("refused", 1, 1, 0).replace(
        r#""terminationGracePeriodSeconds": 1,"#,
        r#""terminationGracePeriodSeconds": 1, "runtimeClassName": "nope","#,
    );
    node.ok_stdin(&["apply", "-f", "-"], &spec);
    eventually(60, || {
        (get(node, "rs -l app=refused", r#"{.items[0].status.conditions[?(@.type=="ReplicaFailure")].reason}"#)
            == "FailedCreate")
            .then_some(())
    });
    let message =
        get(node, "rs -l app=refused", r#"{.items[0].status.conditions[?(@.type=="ReplicaFailure")].message}"#);
    assert!(message.contains(r#"RuntimeClass "nope" not found"#), "{message}");
    eventually(30, || {
        (get(node, "deploy/refused", r#"{.status.conditions[?(@.type=="ReplicaFailure")].reason}"#) == "FailedCreate")
            .then_some(())
    });
    let events = node.ok(&["get", "events", "--field-selector", "reason=FailedCreate"]);
    assert!(events.contains("Error creating: pods"), "{events}");
    // Backoff, not a hot loop: a handful of attempts in a few seconds.
    std::thread::sleep(Duration::from_secs(3));
    let count: u32 = get(node, "events --field-selector reason=FailedCreate", "{.items[0].count}").parse().unwrap_or(0);
    assert!((1..=20).contains(&count), "{count} FailedCreate attempts in a few seconds");
    node.ok(&["delete", "deployment", "refused"]);
}

/// Invalid specs are 422s with upstream's causes, and nothing is stored.
fn check_invalid(node: &Server) {
    let bad = r#"{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "bad"},
      "spec": {"replicas": -1, "selector": {"matchLabels": {"app": "a"}},
        "strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}},
        "template": {"metadata": {"labels": {"app": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}"#;
    let err = node.kubectl_stdin(&["create", "-f", "-"], bad);
    let text = String::from_utf8_lossy(&err.stderr).into_owned();
    assert!(!err.status.success());
    for want in [
        "The Deployment \"bad\" is invalid",
        "spec.replicas: Invalid value: -1: must be greater than or equal to 0",
        "spec.template.metadata.labels: Invalid value",
        "`selector` does not match template `labels`",
        "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: 0: may not be 0 when `maxSurge` is 0",
    ] {
        assert!(text.contains(want), "{want:?} not in {text}");
    }
    assert!(node.fails(&["get", "deployment", "bad"]).contains("NotFound"));
    node.ok_stdin(&["apply", "-f", "-"], &deployment("fixed", 0, 1, 0));
    let moved =
        node.kubectl(&["patch", "deployment", "fixed", "-p", r#"{"spec":{"selector":{"matchLabels":{"app":"x"}}}}"#]);
    assert!(String::from_utf8_lossy(&moved.stderr).contains("field is immutable"));
    let scale = node.kubectl(&[
        "patch",
        "deployment",
        "fixed",
        "--subresource=scale",
        "--type=merge",
        "-p",
        r#"{"spec":{"replicas":-2}}"#,
    ]);
    let text = String::from_utf8_lossy(&scale.stderr);
    assert!(text.contains("spec.replicas: Invalid value: -2: must be greater than or equal to 0"), "{text}");
    node.ok(&["delete", "deployment", "fixed"]);
}

/// cairn killed with SIGKILL mid-rollout (slowed by minReadySeconds): the rollout finishes after the
/// restart and the pods never exceed replicas + maxSurge.
fn check_kill9_mid_rollout(node: &mut Node) {
    node.ok_stdin(&["apply", "-f", "-"], &deployment_with("survivor", 4, 1, 1, 2));
    rollout_status(node, "survivor");
    node.ok(&["set", "image", "deployment/survivor", &format!("main={BUSYBOX_2}")]);
    eventually(60, || {
        (get(node, "rs -l app=survivor", "{.items[*].metadata.name}").split(' ').count() == 2).then_some(())
    });
    let before = get(node, "deploy/survivor", "{.status.updatedReplicas}");
    node.restart_after_kill9();
    eventually(60, || node_ready(node));
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (live, _) = pod_counts(node, "app=survivor");
        assert!(live <= 5, "{live} pods with replicas 4 and maxSurge 1 after a restart");
        let done =
            get(node, "deploy/survivor", "{.status.updatedReplicas}/{.status.replicas}/{.status.availableReplicas}");
        if done == "4/4/4" && live == 4 {
            break;
        }
        assert!(Instant::now() < deadline, "rollout did not finish after the restart: {done}\n{}", node.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_ne!(before, "4", "the rollout was over before cairn was killed");
    assert!(live_images(node, "app=survivor").split(' ').all(|i| i == BUSYBOX_2));
    node.ok(&["delete", "deployment", "survivor"]);
}

fn job(name: &str, spec: &str, script: &str) -> String {
    format!(
        r#"{{"apiVersion": "batch/v1", "kind": "Job", "metadata": {{"name": "{name}"}},
  "spec": {{{spec} "template": {{"spec": {{"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
      "containers": [{{"name": "main", "image": "{BUSYBOX}", "command": ["/bin/sh", "-c", "{script}"]}}]}}}}}}}}"#
    )
}

/// Job pods: (not being deleted and not finished, Succeeded).
fn job_pods(node: &Server, name: &str) -> (usize, usize) {
    let out = node.kubectl(&[
        "get",
        "pods",
        "-l",
        &format!("batch.kubernetes.io/job-name={name}"),
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.deletionTimestamp}|{.status.phase}{"\n"}{end}"#,
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let running = text.lines().filter(|l| *l == "|Pending" || *l == "|Running").count();
    (running, text.lines().filter(|l| l.ends_with("|Succeeded")).count())
}

/// An Indexed Job of 5 with parallelism 2: one success per index, never more than 2 at a time.
fn check_indexed_job(node: &Server) {
    node.ok_stdin(
        &["apply", "-f", "-"],
        &job(
            "indexed",
            r#""completions": 5, "parallelism": 2, "completionMode": "Indexed","#,
            "echo index=$JOB_COMPLETION_INDEX; sleep 1",
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (running, _) = job_pods(node, "indexed");
        assert!(running <= 2, "{running} pods of a Job with parallelism 2");
        if get(node, "job/indexed", r#"{.status.conditions[?(@.type=="Complete")].status}"#) == "True" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the Indexed Job did not complete:\n{}",
            node.ok(&["get", "pods", "-o", "wide"])
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = node.ok(&["wait", "--for=condition=complete", "job/indexed", "--timeout=10s"]);
    assert!(out.contains("condition met"), "{out}");
    assert_eq!(get(node, "job/indexed", "{.status.completedIndexes} {.status.succeeded} {.status.failed}"), "0-4 5 0");
    let mut indexes: Vec<String> =
        get(node, "pods -l batch.kubernetes.io/job-name=indexed", "{.items[*].metadata.name}")
            .split_whitespace()
            .map(|pod| node.ok(&["logs", pod]).trim().to_string())
            .collect();
    indexes.sort();
    assert_eq!(indexes, ["index=0", "index=1", "index=2", "index=3", "index=4"]);
    let finalizers = get(node, "pods -l batch.kubernetes.io/job-name=indexed", "{.items[*].metadata.finalizers}");
    assert!(finalizers.trim().is_empty(), "tracking finalizers left: {finalizers}");
    let table = node.ok(&["get", "job", "indexed"]);
    assert!(
        table.lines().nth(1).is_some_and(|l| l.split_whitespace().take(3).eq(["indexed", "Complete", "5/5"])),
        "{table}"
    );
    node.ok(&["delete", "job", "indexed"]);
}

/// A Job whose pods fail: replaced after the failure backoff, then Failed at its backoffLimit.
fn check_failing_job(node: &Server) {
    node.ok_stdin(&["apply", "-f", "-"], &job("doomed", r#""backoffLimit": 1,"#, "exit 3"));
    let out = node.kubectl(&["wait", "--for=condition=failed", "job/doomed", "--timeout=90s"]);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stderr), node.log());
    assert_eq!(
        get(node, "job/doomed", r#"{.status.failed} {.status.conditions[?(@.type=="Failed")].reason}"#),
        "2 BackoffLimitExceeded"
    );
    let created = get(node, "pods -l batch.kubernetes.io/job-name=doomed", "{.items[*].metadata.creationTimestamp}");
    let times: Vec<k8s_openapi::jiff::Timestamp> = created.split_whitespace().filter_map(|t| t.parse().ok()).collect();
    assert_eq!(times.len(), 2, "{created}");
    let gap = (times[1].as_second() - times[0].as_second()).abs();
    assert!(gap >= 10, "the replacement came {gap} s after the first pod, within the 10 s failure backoff");
    let events = node.ok(&["get", "events", "--field-selector", "involvedObject.name=doomed"]);
    assert!(
        events.contains("BackoffLimitExceeded") && events.contains("Job has reached the specified backoff limit"),
        "{events}"
    );
    node.ok(&["delete", "job", "doomed"]);
}

/// Job policies, four Jobs side by side. A podFailurePolicy: a failure it ignores is replaced
/// without counting toward backoffLimit 0; an exit code it names fails the Job at once, with
/// upstream's reason and message. A backoffLimitPerIndex: the failing index is retried once
/// (its pod carrying the count), then given up, and the Job fails with FailedIndexes once the
/// other indexes are done. A successPolicy: index 0 done completes the Job, and the pods of the
/// other indexes are stopped.
fn check_job_policies(node: &Server) {
    let policy = r#""podFailurePolicy": {"rules": [
        {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [3]}},
        {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}}]},"#;
    node.ok_stdin(&["apply", "-f", "-"], &job("shrugged", &format!(r#""backoffLimit": 0, {policy}"#), "exit 3"));
    node.ok_stdin(&["apply", "-f", "-"], &job("fatal", policy, "exit 42"));
    let indexed = r#""completionMode": "Indexed", "completions": 3, "parallelism": 3,"#;
    node.ok_stdin(
        &["apply", "-f", "-"],
        &job(
            "per-index",
            &format!(r#"{indexed} "backoffLimitPerIndex": 1,"#),
            "[ $JOB_COMPLETION_INDEX = 1 ] && exit 1; exit 0",
        ),
    );
    node.ok_stdin(
        &["apply", "-f", "-"],
        &job(
            "early",
            &format!(r#"{indexed} "successPolicy": {{"rules": [{{"succeededIndexes": "0"}}]}},"#),
            "[ $JOB_COMPLETION_INDEX = 0 ] && exit 0; sleep 3600",
        ),
    );

    // Ignored failures: replaced again and again, never counted, the Job never failed.
    eventually(60, || {
        let phases = get(node, "pods -l batch.kubernetes.io/job-name=shrugged", "{.items[*].status.phase}");
        (phases.matches("Failed").count() >= 2).then_some(())
    });
    assert_eq!(get(node, "job/shrugged", "{.status.failed} {.status.conditions}"), "0 ");
    node.ok(&["delete", "job", "shrugged"]);

    let wait = |name: &str, condition: &str| {
        let out =
            node.kubectl(&["wait", &format!("--for=condition={condition}"), &format!("job/{name}"), "--timeout=90s"]);
        assert!(out.status.success(), "{name}: {}{}", String::from_utf8_lossy(&out.stderr), node.log());
    };
    let reason = |name: &str, condition: &str| {
        get(node, &format!("job/{name}"), &format!(r#"{{.status.conditions[?(@.type=="{condition}")].reason}}"#))
    };
    wait("fatal", "failed");
    let pods = get(node, "pods -l batch.kubernetes.io/job-name=fatal", "{.items[*].metadata.name}");
    assert_eq!(pods.split_whitespace().count(), 1, "one pod fails the Job: {pods}");
    assert_eq!(get(node, "job/fatal", "{.status.failed}"), "1");
    assert_eq!(reason("fatal", "Failed"), "PodFailurePolicy");
    let message = get(node, "job/fatal", r#"{.status.conditions[?(@.type=="Failed")].message}"#);
    assert_eq!(
        message,
        format!(
            "Container main for pod default/{} failed with exit code 42 matching FailJob rule at index 1",
            pods.trim()
        )
    );

    wait("early", "complete");
    assert_eq!(reason("early", "Complete"), "SuccessPolicy");
    assert_eq!(get(node, "job/early", "{.status.succeeded} {.status.completedIndexes} {.status.active}"), "1 0 0");
    let message = get(node, "job/early", r#"{.status.conditions[?(@.type=="SuccessCriteriaMet")].message}"#);
    assert_eq!(message, "Matched rules at index 0");

    wait("per-index", "failed");
    assert_eq!(reason("per-index", "Failed"), "FailedIndexes");
    assert_eq!(
        get(node, "job/per-index", "{.status.failedIndexes} {.status.completedIndexes} {.status.failed}"),
        "1 0,2 2"
    );
    let retried = get(
        node,
        "pods -l batch.kubernetes.io/job-completion-index=1,batch.kubernetes.io/job-name=per-index",
        "{.items[*].metadata.annotations.batch\\.kubernetes\\.io/job-index-failure-count}",
    );
    let mut counts: Vec<&str> = retried.split_whitespace().collect();
    counts.sort();
    assert_eq!(counts, ["0", "1"], "index 1 was tried twice");
    node.ok(&["delete", "job", "fatal", "early", "per-index"]);
}

/// `ttlSecondsAfterFinished`: the Job and its pods go once it has been finished that long.
fn check_ttl(node: &Server) {
    node.ok_stdin(&["apply", "-f", "-"], &job("brief", r#""ttlSecondsAfterFinished": 1,"#, "true"));
    eventually(60, || (!node.kubectl(&["get", "job", "brief"]).status.success()).then_some(()));
    eventually(60, || {
        get(node, "pods -l batch.kubernetes.io/job-name=brief", "{.items[*].metadata.name}").is_empty().then_some(())
    });
}

/// cairn killed with SIGKILL while a Job runs: no completion lost or counted twice.
fn check_kill9_mid_job(node: &mut Node) {
    node.ok_stdin(&["apply", "-f", "-"], &job("steadfast", r#""completions": 4, "parallelism": 2,"#, "sleep 1"));
    eventually(60, || (job_pods(node, "steadfast").1 >= 1).then_some(()));
    node.restart_after_kill9();
    eventually(60, || node_ready(node));
    let out = node.kubectl(&["wait", "--for=condition=complete", "job/steadfast", "--timeout=90s"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(get(node, "job/steadfast", "{.status.succeeded}"), "4");
    assert_eq!(job_pods(node, "steadfast"), (0, 4), "exactly 4 pods succeeded");
    node.ok(&["delete", "job", "steadfast"]);
}

fn stateful_set(name: &str, replicas: u32, extra: &str) -> String {
    format!(
        r#"{{"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {{"name": "{name}"}},
  "spec": {{"replicas": {replicas}, "serviceName": "{name}", "selector": {{"matchLabels": {{"app": "{name}"}}}}, {extra}
    "template": {{"metadata": {{"labels": {{"app": "{name}"}}}}, "spec": {{"terminationGracePeriodSeconds": 5,
      "containers": [{{"name": "main", "image": "{BUSYBOX}", "command": ["/bin/sh", "-c",
        "[ -f /data/id ] || hostname > /data/id; {STOPS_ON_TERM}"], "volumeMounts": [{{"name": "data", "mountPath": "/data"}}]}}]}}}},
    "volumeClaimTemplates": [{{"metadata": {{"name": "data"}},
      "spec": {{"accessModes": ["ReadWriteOnce"], "resources": {{"requests": {{"storage": "16Mi"}}}}}}}}]}}}}"#
    )
}

fn sts_rollout_status(node: &Server, name: &str) -> String {
    let out = node.kubectl(&["rollout", "status", &format!("statefulset/{name}"), "--timeout=90s"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "rollout of {name} did not finish: {text}{}\n{}\n--- server log ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        node.ok(&["get", "sts,pods,pvc", "-o", "wide"]),
        node.log()
    );
    text
}

/// Names of the pods of `selector` not being deleted, in order.
fn live_pods(node: &Server, selector: &str) -> Vec<String> {
    let path = r#"{range .items[*]}{.metadata.deletionTimestamp}|{.metadata.name}{"\n"}{end}"#;
    let mut names: Vec<String> = get(node, &format!("pods -l {selector}"), path)
        .lines()
        .filter_map(|l| l.strip_prefix('|').map(String::from))
        .collect();
    names.sort();
    names
}

fn sts_exec(node: &Server, pod: &str, script: &str) -> String {
    node.ok(&["exec", pod, "--", "sh", "-c", script])
}

/// A StatefulSet of 3 with a claim each: made in order, each pod once the one before is Ready;
/// stable names, hostnames and claims across a pod deletion and a scale down and up; a
/// partitioned rolling update, then the whole, then undo through its ControllerRevisions.
fn check_stateful_set(node: &Server) {
    node.ok_stdin(&["apply", "-f", "-"], &stateful_set("web", 3, ""));
    // OrderedReady: never a pod before its predecessor is Ready.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let path = r#"{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}"#;
        let states = get(node, "pods -l app=web", path);
        let mut ready: Vec<(String, bool)> = states
            .split_whitespace()
            .filter_map(|s| s.split_once('=').map(|(n, r)| (n.to_string(), r == "True")))
            .collect();
        ready.sort();
        let names: Vec<&str> = ready.iter().map(|(n, _)| n.as_str()).collect();
        assert!(["web-0", "web-1", "web-2"].starts_with(&names), "pods out of order: {states}");
        assert!(
            ready.iter().rev().skip(1).all(|(_, r)| *r),
            "a pod was made before the one before it was Ready: {states}"
        );
        if ready.len() == 3 && ready.iter().all(|(_, r)| *r) {
            break;
        }
        assert!(Instant::now() < deadline, "the StatefulSet did not come up: {states}\n{}", node.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = sts_rollout_status(node, "web");
    // A defaulted partition of 0 makes every rollout a partitioned one to kubectl, as upstream.
    assert!(status.contains("partitioned roll out complete: 3 new pods have been updated"), "{status}");
    let table = node.ok(&["get", "sts", "web"]);
    assert!(table.lines().nth(1).is_some_and(|l| l.split_whitespace().take(2).eq(["web", "3/3"])), "{table}");
    let claims = get(node, "pvc -l app=web", r#"{range .items[*]}{.metadata.name}={.status.phase} {end}"#);
    assert_eq!(claims.trim(), "data-web-0=Bound data-web-1=Bound data-web-2=Bound");
    assert_eq!(sts_exec(node, "web-1", "hostname; cat /data/id"), "web-1\nweb-1\n");
    assert_eq!(
        get(node, "pod/web-1", "{.spec.subdomain} {.metadata.labels.statefulset\\.kubernetes\\.io/pod-name}"),
        "web web-1"
    );
    let events = node.ok(&["get", "events", "--field-selector", "involvedObject.name=web"]);
    assert!(
        events.contains("create Claim data-web-0 Pod web-0 in StatefulSet web success")
            && events.contains("create Pod web-2 in StatefulSet web successful"),
        "{events}"
    );

    // A deleted pod comes back under its name, on its claim.
    sts_exec(node, "web-1", "echo kept > /data/marker");
    let uid = get(node, "pod/web-1", "{.metadata.uid}");
    node.ok(&["delete", "pod", "web-1", "--wait=false"]);
    eventually(60, || {
        let now = get(node, "pod/web-1", r#"{.metadata.uid} {.status.conditions[?(@.type=="Ready")].status}"#);
        (now.split(' ').next() != Some(uid.as_str()) && now.ends_with("True")).then_some(())
    });
    assert_eq!(sts_exec(node, "web-1", "cat /data/marker /data/id"), "kept\nweb-1\n");

    // Scale down goes from the highest ordinal, one at a time; the claims stay.
    node.ok(&["scale", "sts/web", "--replicas=1"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let live = live_pods(node, "app=web");
        let live: Vec<&str> = live.iter().map(String::as_str).collect();
        assert!(["web-0", "web-1", "web-2"].starts_with(&live), "web-1 went before web-2: {live:?}");
        if live == ["web-0"] && get(node, "pods -l app=web", "{.items[*].metadata.name}") == "web-0" {
            break;
        }
        assert!(Instant::now() < deadline, "scale down did not finish: {live:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(get(node, "pvc -l app=web", "{.items[*].metadata.name}"), "data-web-0 data-web-1 data-web-2");
    node.ok(&["scale", "sts/web", "--replicas=3"]);
    sts_rollout_status(node, "web");
    assert_eq!(sts_exec(node, "web-2", "cat /data/id"), "web-2\n", "web-2 is back on its own claim");

    // A partitioned update replaces only the pods at or above the partition.
    node.ok(&["patch", "sts/web", "-p", r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":2}}}}"#]);
    node.ok(&["set", "image", "sts/web", &format!("main={BUSYBOX_2}")]);
    let status = sts_rollout_status(node, "web");
    assert!(status.contains("partitioned roll out complete: 1 new pods have been updated"), "{status}");
    let images = |node: &Server| get(node, "pods -l app=web", r#"{range .items[*]}{.spec.containers[0].image} {end}"#);
    assert_eq!(images(node).trim(), format!("{BUSYBOX} {BUSYBOX} {BUSYBOX_2}"));
    node.ok(&["patch", "sts/web", "-p", r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":0}}}}"#]);
    sts_rollout_status(node, "web");
    eventually(60, || (images(node).trim() == format!("{BUSYBOX_2} {BUSYBOX_2} {BUSYBOX_2}")).then_some(()));
    let revisions = get(node, "controllerrevisions -l app=web", "{range .items[*]}{.revision} {end}");
    assert_eq!(revisions.trim(), "1 2");
    assert_eq!(get(node, "sts/web", "{.status.currentRevision}"), get(node, "sts/web", "{.status.updateRevision}"));
    let history = node.ok(&["rollout", "history", "sts/web"]);
    assert!(
        history.contains("REVISION") && history.lines().filter(|l| l.starts_with(['1', '2'])).count() == 2,
        "{history}"
    );
    node.ok(&["rollout", "undo", "sts/web"]);
    sts_rollout_status(node, "web");
    eventually(60, || (images(node).trim() == format!("{BUSYBOX} {BUSYBOX} {BUSYBOX}")).then_some(()));
    let mut revisions: Vec<String> =
        get(node, "controllerrevisions -l app=web", "{.items[*].revision}").split(' ').map(String::from).collect();
    revisions.sort();
    assert_eq!(revisions, ["2", "3"], "undo renumbers the first revision");
    assert_eq!(sts_exec(node, "web-0", "cat /data/id"), "web-0\n");

    // Deleting the set takes its pods; the claims are retained by default.
    node.ok(&["delete", "sts", "web"]);
    eventually(60, || get(node, "pods -l app=web", "{.items[*].metadata.name}").is_empty().then_some(()));
    assert_eq!(get(node, "pvc -l app=web", "{.items[*].metadata.name}"), "data-web-0 data-web-1 data-web-2");
    node.ok(&["delete", "pvc", "-l", "app=web", "--wait=false"]);
}

/// Parallel pod management and a retention policy deleting claims on scale down and with the set.
fn check_parallel_stateful_set(node: &Server) {
    let extra = r#""podManagementPolicy": "Parallel",
      "persistentVolumeClaimRetentionPolicy": {"whenScaled": "Delete", "whenDeleted": "Delete"},"#;
    node.ok_stdin(&["apply", "-f", "-"], &stateful_set("burst", 3, extra));
    // Parallel: every pod is made without waiting for the others to be Ready.
    eventually(30, || (live_pods(node, "app=burst").len() == 3).then_some(()));
    sts_rollout_status(node, "burst");
    let owner =
        get(node, "pvc/data-burst-0", "{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}");
    assert_eq!(owner, "StatefulSet/burst");
    node.ok(&["scale", "sts/burst", "--replicas=1"]);
    eventually(60, || (get(node, "pvc -l app=burst", "{.items[*].metadata.name}") == "data-burst-0").then_some(()));
    node.ok(&["delete", "sts", "burst"]);
    eventually(60, || get(node, "pvc -l app=burst", "{.items[*].metadata.name}").is_empty().then_some(()));
}

fn daemon_set(name: &str, extra: &str) -> String {
    format!(
        r#"{{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {{"name": "{name}"}},
  "spec": {{"selector": {{"matchLabels": {{"app": "{name}"}}}},
    "template": {{"metadata": {{"labels": {{"app": "{name}"}}}}, "spec": {{{extra} "terminationGracePeriodSeconds": 5,
      "containers": [{{"name": "main", "image": "{BUSYBOX}", "command": ["/bin/sh", "-c", "{STOPS_ON_TERM}"]}}]}}}}}}}}"#
    )
}

fn ds_rollout_status(node: &Server, name: &str) -> String {
    let out = node.kubectl(&["rollout", "status", &format!("daemonset/{name}"), "--timeout=90s"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "rollout of {name} did not finish: {text}{}\n{}\n--- server log ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        node.ok(&["get", "ds,pods", "-o", "wide"]),
        node.log()
    );
    text
}

/// DaemonSets: a pod on the node with the daemon tolerations, kept off a tainted node unless
/// tolerated, a pod for a node that joins and none once it leaves, a rolling update and undo.
fn check_daemon_sets(node: &Server) {
    let name = get(node, "nodes", "{.items[0].metadata.name}");
    node.ok_stdin(&["apply", "-f", "-"], &daemon_set("agent", ""));
    let status = ds_rollout_status(node, "agent");
    assert!(status.contains("daemon set \"agent\" successfully rolled out"), "{status}");
    let table = node.ok(&["get", "ds", "agent"]);
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "NODE", "SELECTOR", "AGE"]);
    assert!(
        table.lines().nth(1).is_some_and(|l| l.split_whitespace().take(6).eq(["agent", "1", "1", "1", "1", "1"])),
        "{table}"
    );
    assert_eq!(get(node, "pods -l app=agent", "{.items[*].spec.nodeName}"), name);
    let tolerations = get(node, "pods -l app=agent", "{.items[0].spec.tolerations[*].key}");
    assert!(
        tolerations.contains("node.kubernetes.io/not-ready")
            && tolerations.contains("node.kubernetes.io/unschedulable"),
        "{tolerations}"
    );

    // A NoSchedule taint keeps new daemon pods off the node unless they tolerate it; running ones stay.
    node.ok(&["taint", "node", &name, "dedicated=edge:NoSchedule"]);
    node.ok_stdin(&["apply", "-f", "-"], &daemon_set("picky", ""));
    let tolerant = r#""tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],"#;
    node.ok_stdin(&["apply", "-f", "-"], &daemon_set("tolerant", tolerant));
    ds_rollout_status(node, "tolerant");
    assert_eq!(live_pods(node, "app=tolerant").len(), 1);
    eventually(30, || (get(node, "ds/picky", "{.status.observedGeneration}") == "1").then_some(()));
    assert_eq!(get(node, "ds/picky", "{.status.desiredNumberScheduled}"), "0");
    assert!(live_pods(node, "app=picky").is_empty());
    assert_eq!(live_pods(node, "app=agent").len(), 1, "a NoSchedule taint lets a running daemon pod stay");
    node.ok(&["taint", "node", &name, "dedicated-"]);
    ds_rollout_status(node, "picky");
    assert_eq!(live_pods(node, "app=picky").len(), 1, "the taint gone, the pod comes");
    node.ok(&["delete", "ds", "picky", "tolerant"]);

    // A node that joins gets a pod meant for it; once it leaves the pod goes.
    node.ok_stdin(&["apply", "-f", "-"], r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "joiner"}}"#);
    eventually(30, || (get(node, "ds/agent", "{.status.desiredNumberScheduled}") == "2").then_some(()));
    let affinity = r#"{range .items[*]}{.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].values[0]} {end}"#;
    eventually(30, || get(node, "pods -l app=agent", affinity).contains("joiner").then_some(()));
    node.ok(&["delete", "node", "joiner"]);
    eventually(30, || (get(node, "ds/agent", "{.status.desiredNumberScheduled}") == "1").then_some(()));
    eventually(30, || (get(node, "pods -l app=agent", affinity).trim() == name).then_some(()));

    // A rolling update replaces the pod; undo goes back through the ControllerRevisions.
    node.ok(&["set", "image", "ds/agent", &format!("main={BUSYBOX_2}")]);
    ds_rollout_status(node, "agent");
    let image = |node: &Server| {
        get(
            node,
            "pods -l app=agent",
            r#"{range .items[*]}{.metadata.deletionTimestamp}|{.spec.containers[0].image} {end}"#,
        )
    };
    eventually(60, || (image(node).trim() == format!("|{BUSYBOX_2}")).then_some(()));
    assert_eq!(get(node, "controllerrevisions -l app=agent", "{.items[*].revision}").split(' ').count(), 2);
    node.ok(&["rollout", "undo", "ds/agent"]);
    ds_rollout_status(node, "agent");
    eventually(60, || (image(node).trim() == format!("|{BUSYBOX}")).then_some(()));
    node.ok(&["delete", "ds", "agent"]);
    eventually(60, || live_pods(node, "app=agent").is_empty().then_some(()));
}

/// StatefulSets and DaemonSets on a node of their own, beside the Deployment and Job checks.
#[test]
fn stateful_sets_and_daemon_sets_run_like_kubernetes() {
    let node = Node::start("10.50.0.0/16");
    eventually(60, || node_ready(&node));
    let images = node.dir.path().join("data/agent/images");
    std::fs::write(images.join("busybox-2.tar"), busybox::busybox_image_named(BUSYBOX_2)).unwrap();
    eventually(60, || get(&node, "nodes", "{.items[0].status.images[*].names}").contains(BUSYBOX_2).then_some(()));

    check_daemon_sets(&node);
    check_stateful_set(&node);
    check_parallel_stateful_set(&node);
}

#[test]
fn deployments_and_jobs_run_like_kubernetes() {
    let mut node = Node::start(CIDR);
    eventually(60, || node_ready(&node));
    let images = node.dir.path().join("data/agent/images");
    std::fs::write(images.join("busybox-2.tar"), busybox::busybox_image_named(BUSYBOX_2)).unwrap();
    eventually(60, || get(&node, "nodes", "{.items[0].status.images[*].names}").contains(BUSYBOX_2).then_some(()));

    check_invalid(&node);
    check_create_scale_and_undo(&node);
    check_max_unavailable_zero(&node);
    check_recreate(&node);
    check_refused_pods(&node);
    check_indexed_job(&node);
    check_failing_job(&node);
    check_job_policies(&node);
    check_ttl(&node);
    check_kill9_mid_rollout(&mut node);
    check_kill9_mid_job(&mut node);
}

/// `kubectl drain` against a PodDisruptionBudget: blocked while the budget allows no disruption
/// (the node stays cordoned), one pod at a time when it allows one, and through when it allows all.
fn check_drain(node: &Server) {
    let name = get(node, "nodes", "{.items[0].metadata.name}");
    node.ok_stdin(&["apply", "-f", "-"], &deployment("guarded", 2, 1, 0));
    rollout_status(node, "guarded");
    let pdb = r#"{"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guarded"},
      "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "guarded"}}}}"#;
    node.ok_stdin(&["apply", "-f", "-"], pdb);
    let budget = |node: &Server| {
        get(node, "pdb/guarded", "{.status.currentHealthy}/{.status.desiredHealthy}/{.status.disruptionsAllowed}")
    };
    eventually(30, || (budget(node) == "2/2/0").then_some(()));
    let table = node.ok(&["get", "pdb", "guarded"]);
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "MIN", "AVAILABLE", "MAX", "UNAVAILABLE", "ALLOWED", "DISRUPTIONS", "AGE"]);
    assert!(
        table.lines().nth(1).is_some_and(|l| l.split_whitespace().take(4).eq(["guarded", "2", "N/A", "0"])),
        "{table}"
    );

    // No disruption allowed: drain cordons the node, evicts nothing, and gives up at its timeout.
    let out = node.kubectl(&["drain", &name, "--ignore-daemonsets", "--timeout=6s"]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("Cannot evict pod as it would violate the pod's disruption budget."), "{text}");
    assert!(node.ok(&["get", "node", &name]).contains("SchedulingDisabled"));
    assert_eq!(
        pod_counts(node, "app=guarded"),
        (2, 2),
        "a pod went although the budget allowed none\n{}\n--- server log ---\n{}",
        node.ok(&["get", "pods", "-o", "yaml"]),
        node.log()
    );

    // One allowed: one pod goes; its replacement cannot be scheduled on the cordoned node, so the
    // second eviction waits.
    node.ok(&["patch", "pdb", "guarded", "--type=merge", "-p", r#"{"spec":{"minAvailable":1}}"#]);
    eventually(30, || (budget(node) == "2/1/1").then_some(()));
    let out = node.kubectl(&["drain", &name, "--ignore-daemonsets", "--timeout=8s"]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success() && text.contains("evicted"), "{text}");
    eventually(30, || (pod_counts(node, "app=guarded") == (2, 1)).then_some(()));
    eventually(30, || (budget(node) == "1/1/0").then_some(()));

    // All allowed: the drain goes through.
    node.ok(&["patch", "pdb", "guarded", "--type=merge", "-p", r#"{"spec":{"minAvailable":0}}"#]);
    let out = node.kubectl(&["drain", &name, "--ignore-daemonsets", "--timeout=60s"]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains(&format!("node/{name} drained")), "{text}");
    assert_eq!(pod_counts(node, "app=guarded").1, 0);
    node.ok(&["uncordon", &name]);
    rollout_status(node, "guarded");
    node.ok(&["delete", "deployment,pdb", "guarded"]);
}

/// A CronJob every minute: its Job within 70 s, the next start skipped while it runs under
/// Forbid, `kubectl create job --from`, and schedules refused as upstream refuses them; then
/// `kubectl drain` against a PodDisruptionBudget on the same node.
#[test]
fn cron_jobs_run_on_schedule() {
    let node = Node::start("10.51.0.0/16");
    eventually(60, || node_ready(&node));
    let bad = node.fails(&["create", "cronjob", "bad", &format!("--image={BUSYBOX}"), "--schedule=61 * * * *"]);
    assert!(bad.contains(r#"spec.schedule: Invalid value: "61 * * * *""#), "{bad}");
    let zoned = r#"{"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "zoned"},
      "spec": {"schedule": "0 * * * *", "timeZone": "Mars/Olympus", "jobTemplate": {"spec": {"template": {"spec":
        {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}}}}"#;
    let out = node.kubectl_stdin(&["apply", "-f", "-"], zoned);
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains(r#"spec.timeZone: Invalid value: "Mars/Olympus": unknown time zone Mars/Olympus"#), "{text}");

    let tick = format!(
        r#"{{"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {{"name": "tick"}},
      "spec": {{"schedule": "*/1 * * * *", "concurrencyPolicy": "Forbid", "jobTemplate": {{"spec": {{"template": {{"spec":
        {{"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
          "containers": [{{"name": "main", "image": "{BUSYBOX}", "command": ["/bin/sh", "-c", "{STOPS_ON_TERM}"]}}]}}}}}}}}}}}}"#
    );
    node.ok_stdin(&["apply", "-f", "-"], &tick);
    let table = node.ok(&["get", "cj", "tick"]);
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST", "SCHEDULE", "AGE"]);
    let owned = |node: &Server| {
        let path = r#"{range .items[*]}{.metadata.ownerReferences[0].name}/{.metadata.name} {end}"#;
        get(node, "jobs", path).split_whitespace().filter(|j| j.starts_with("tick/")).count()
    };
    eventually(70, || (owned(&node) == 1).then_some(()));
    eventually(30, || (get(&node, "cj/tick", "{.status.active[*].name}").starts_with("tick-")).then_some(()));
    assert!(!get(&node, "cj/tick", "{.status.lastScheduleTime}").is_empty());
    eventually(60, || (job_pods(&node, &get(&node, "cj/tick", "{.status.active[0].name}")).0 == 1).then_some(()));

    // The next minute comes while the first Job still runs: Forbid starts no second one.
    eventually(75, || {
        node.ok(&["get", "events", "--field-selector", "involvedObject.name=tick"])
            .contains("JobAlreadyActive")
            .then_some(())
    });
    assert_eq!(owned(&node), 1, "a second Job started under Forbid");

    let out = node.ok(&["create", "job", "manual", "--from=cronjob/tick"]);
    assert_eq!(out.trim(), "job.batch/manual created");
    assert_eq!(get(&node, "job/manual", "{.metadata.annotations.cronjob\\.kubernetes\\.io/instantiate}"), "manual");
    node.ok(&["delete", "cronjob", "tick"]);
    eventually(60, || (owned(&node) == 0).then_some(()));
    check_drain(&node);
}
