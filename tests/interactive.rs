//! End to end: kubectl exec, cp, port-forward, debug and top against the real cairn with its embedded
//! containerd, over kubectl's default WebSocket protocols and with the SPDY fallback forced. One
//! node serves every check (they use separate pods); the busybox image is built by the test.
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

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use busybox::BUSYBOX;
use common::{Server, eventually};
use node::{Node, https_request, node_ready};

const CIDR: &str = "10.47.0.0/16";

/// kubectl with extra environment (the SPDY fallback switches).
fn kubectl_env(node: &Server, env: &[(&str, &str)], args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut cmd = Command::new(common::kubectl_path());
    cmd.arg("--kubeconfig").arg(&node.kubeconfig).args(args).envs(env.iter().copied());
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run kubectl");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(input).expect("write stdin");
    }
    child.wait_with_output().expect("kubectl output")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run_pod(node: &Server, name: &str, script: &str) {
    run_pod_with(node, name, script, "");
}

/// A busybox pod running `script`, with `extra` lines added to its container.
fn run_pod_with(node: &Server, name: &str, script: &str, extra: &str) {
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", {script:?}]
{extra}
"#
    );
    node.ok_stdin(&["apply", "-f", "-"], &yaml);
}

fn wait_ready(node: &Server, name: &str) {
    let out = node.kubectl(&["wait", "--for=condition=Ready", &format!("pod/{name}"), "--timeout=60s"]);
    let pod = node.kubectl(&["get", "pod", name, "-o", "yaml"]);
    assert!(
        out.status.success(),
        "pod {name} is not ready:\n{}\n--- server log ---\n{}",
        text(&pod.stdout),
        node.log()
    );
}

/// `GET /` on 127.0.0.1:`port`, the whole answer.
fn http_get(port: u16) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// exec over WebSocket (`env` empty) or SPDY: exit codes, stdin to EOF, and errors.
fn check_exec(node: &Server, env: &[(&str, &str)]) {
    let how = if env.is_empty() { "websocket" } else { "spdy" };
    let ok = kubectl_env(node, env, &["exec", "shell", "--", "sh", "-c", "echo out; echo err >&2"], None);
    assert!(ok.status.success(), "{how}: exec failed: {}", text(&ok.stderr));
    assert_eq!(text(&ok.stdout), "out\n", "{how}: stdout");
    assert_eq!(text(&ok.stderr), "err\n", "{how}: stderr");

    let three = kubectl_env(node, env, &["exec", "shell", "--", "sh", "-c", "exit 3"], None);
    assert_eq!(three.status.code(), Some(3), "{how}: exit code; stderr: {}", text(&three.stderr));
    assert!(text(&three.stderr).contains("command terminated with exit code 3"), "{how}: {}", text(&three.stderr));

    let piped = kubectl_env(node, env, &["exec", "-i", "shell", "--", "sh", "-c", "cat; echo done"], Some(b"hello\n"));
    assert!(piped.status.success(), "{how}: exec -i failed: {}", text(&piped.stderr));
    assert_eq!(text(&piped.stdout), "hello\ndone\n", "{how}: stdin reaches the command and EOF ends it");

    let missing = kubectl_env(node, env, &["exec", "shell", "-c", "nope", "--", "true"], None);
    assert!(!missing.status.success());
    assert!(text(&missing.stderr).contains("container nope is not valid for pod shell"), "{}", text(&missing.stderr));

    let no_pod = kubectl_env(node, env, &["exec", "nopod", "--", "true"], None);
    assert!(text(&no_pod.stderr).contains(r#"pods "nopod" not found"#), "{}", text(&no_pod.stderr));

    let unknown = kubectl_env(node, env, &["exec", "shell", "--", "/no/such/command"], None);
    assert!(!unknown.status.success(), "{how}: an unknown command fails");
    assert!(text(&unknown.stderr).contains("no such file or directory"), "{how}: {}", text(&unknown.stderr));

    // A client that goes away takes its command with it.
    let seconds = if env.is_empty() { "1001" } else { "1002" };
    let mut gone = Command::new(common::kubectl_path())
        .arg("--kubeconfig")
        .arg(&node.kubeconfig)
        .args(["exec", "shell", "--", "sleep", seconds])
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let sleeping =
        || node.ok(&["exec", "shell", "--", "ps", "-o", "args"]).lines().any(|l| l == format!("sleep {seconds}"));
    eventually(20, || sleeping().then_some(()));
    gone.kill().unwrap();
    gone.wait().unwrap();
    eventually(20, || (!sleeping()).then_some(()));
}

/// `kubectl cp` (tar over exec) of 5 MiB both ways.
fn check_cp(node: &Server, env: &[(&str, &str)]) {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..5u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let src = dir.path().join("in.bin");
    std::fs::write(&src, &data).unwrap();
    let up = kubectl_env(node, env, &["cp", src.to_str().unwrap(), "shell:/tmp/in.bin"], None);
    assert!(up.status.success(), "cp in: {}", text(&up.stderr));
    let size = kubectl_env(node, env, &["exec", "shell", "--", "wc", "-c", "/tmp/in.bin"], None);
    assert!(text(&size.stdout).starts_with(&format!("{} ", data.len())), "size in the pod: {}", text(&size.stdout));
    let back = dir.path().join("out.bin");
    let down = kubectl_env(node, env, &["cp", "shell:/tmp/in.bin", back.to_str().unwrap()], None);
    assert!(down.status.success(), "cp out: {}", text(&down.stderr));
    assert!(std::fs::read(&back).unwrap() == data, "the copy back is byte for byte the original");
}

/// A port-forward of two ports: 20 concurrent fetches through one, then a connection to the other,
/// where nothing listens in the pod: the refusal reaches kubectl, which reports it and ends the
/// forward (client-go's `handleConnection` closes the connection on any error-stream message).
fn check_port_forward(node: &Server, env: &[(&str, &str)]) {
    let how = if env.is_empty() { "websocket" } else { "spdy" };
    let (web, refused) = (free_port(), free_port());
    let mut pf = Command::new(common::kubectl_path())
        .arg("--kubeconfig")
        .arg(&node.kubeconfig)
        .args(["port-forward", "pod/web", &format!("{web}:80"), &format!("{refused}:81")])
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let page = eventually(20, || http_get(web).ok().filter(|p| p.contains("hello from web")));
    assert!(page.starts_with("HTTP/1."), "{how}: {page}");
    let fetches: Vec<_> = (0..20).map(|_| std::thread::spawn(move || http_get(web))).collect();
    for f in fetches {
        let page = f.join().unwrap().expect("fetch through the forward");
        assert!(page.contains("hello from web"), "{how}: {page}");
    }
    let nothing = http_get(refused).unwrap_or_default();
    assert!(!nothing.contains("hello"), "{how}: {nothing}");
    let ended = eventually(20, || pf.try_wait().unwrap());
    let out = pf.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert!(!ended.success(), "{how}: kubectl ends the forward after the refusal");
    assert!(
        err.contains("error forwarding port 81") && err.contains("connection refused"),
        "{how}: the refusal is reported: {err}"
    );
}

/// A pseudo-terminal pair of `rows` x `cols`: (master, slave).
fn pty(rows: u16, cols: u16) -> (std::fs::File, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd as _;
    let (mut master, mut slave) = (0, 0);
    let size = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: openpty writes two descriptors it opened into the two integers.
    let rc = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), &size) };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened and are owned by nobody else.
    unsafe { (std::fs::File::from_raw_fd(master), std::os::fd::OwnedFd::from_raw_fd(slave)) }
}

/// Reads the terminal in the background; `wait_for` returns once `want` was seen.
struct Screen(std::sync::Arc<std::sync::Mutex<String>>);

impl Screen {
    fn new(mut master: std::fs::File) -> Screen {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let out = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = master.read(&mut buf) {
                out.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Screen(seen)
    }

    fn wait_for(&self, want: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !self.0.lock().unwrap().contains(want) {
            assert!(std::time::Instant::now() < deadline, "{want:?} not on the terminal: {:?}", self.0.lock().unwrap());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `kubectl exec -it` on a terminal: the command sees a TTY of the terminal's size, follows a
/// resize, and its exit code comes back.
fn check_tty(node: &Server, env: &[(&str, &str)]) {
    use std::os::fd::AsRawFd as _;
    let (master, slave) = pty(30, 100);
    let mut writer = master.try_clone().unwrap();
    let mut child = Command::new(common::kubectl_path())
        .arg("--kubeconfig")
        .arg(&node.kubeconfig)
        .args([
            "exec",
            "-it",
            "shell",
            "--",
            "/bin/sh",
            "-c",
            "echo ready; read x; stty size; read x; stty size; exit 4",
        ])
        .envs(env.iter().copied())
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave))
        .spawn()
        .unwrap();
    let screen = Screen::new(master);
    // kubectl sends the terminal's size as the session starts, beside the command's start: the
    // command reads it once it was told to go on.
    screen.wait_for("ready");
    writer.write_all(b"\n").unwrap();
    screen.wait_for("30 100");
    let size = libc::winsize { ws_row: 40, ws_col: 120, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ reads a winsize from the pointer; kill sends a signal to kubectl.
    unsafe {
        assert_eq!(libc::ioctl(writer.as_raw_fd(), libc::TIOCSWINSZ, &size), 0);
        libc::kill(child.id() as i32, libc::SIGWINCH);
    }
    // The resize travels on its own stream: give it a moment before the command reads the size.
    std::thread::sleep(Duration::from_millis(500));
    writer.write_all(b"\n").unwrap();
    screen.wait_for("40 120");
    let status = eventually(30, || child.try_wait().unwrap());
    assert_eq!(status.code(), Some(4), "the TTY session's exit code; screen: {}", screen.0.lock().unwrap());
}

/// `kubectl attach -i` to a container reading its stdin (`stdinOnce`: it sees EOF when the attach
/// closes stdin, and ends).
fn check_attach(node: &Server) {
    run_pod_with(
        node,
        "talker",
        "while read l; do echo \"got $l\"; done; echo bye",
        "    stdin: true\n    stdinOnce: true\n  restartPolicy: Never",
    );
    wait_ready(node, "talker");
    let out = kubectl_env(node, &[], &["attach", "-i", "talker", "-c", "main"], Some(b"hi\nthere\n"));
    assert!(out.status.success(), "attach: {}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("got hi\ngot there\n"), "the container read what attach sent: {said:?}");
}

/// `kubectl debug -i` adds an ephemeral container that shares the target's process namespace and
/// attaches to it; it runs once, and the pod's own container is left alone.
fn check_debug(node: &Server) {
    use std::io::BufRead as _;
    let image = format!("--image={BUSYBOX}");
    let mut debug = Command::new(common::kubectl_path())
        .arg("--kubeconfig")
        .arg(&node.kubeconfig)
        .args(["debug", "-i", "shell", &image, "--target=main", "-c", "debugger", "--", "/bin/sh"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = debug.stdin.take().unwrap();
    // Attach ends when its stdin does (containerd detaches): keep it open until the answer is in.
    stdin.write_all(b"ps -o pid,args; echo ps-done\n").unwrap();
    let lines: Vec<String> = std::io::BufReader::new(debug.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .take_while(|l| l != "ps-done")
        .collect();
    stdin.write_all(b"exit 0\n").unwrap();
    drop(stdin);
    let status = eventually(30, || debug.try_wait().unwrap());
    assert!(status.success(), "kubectl debug failed");
    let pod = || node.ok(&["get", "pod", "shell", "-o", "yaml"]);
    assert!(
        lines.iter().any(|l| l.ends_with("sleep 3600")),
        "the debugger sees the target's processes: {lines:?}\n{}",
        pod()
    );
    eventually(30, || {
        let jsonpath = "jsonpath={.status.ephemeralContainerStatuses[0].state.terminated.exitCode}";
        (node.ok(&["get", "pod", "shell", "-o", jsonpath]) == "0").then_some(())
    });
    let main = node.ok(&["get", "pod", "shell", "-o", "jsonpath={.status.containerStatuses[0].restartCount}"]);
    assert_eq!(main, "0", "the target container was restarted");
    // The target must be one of the pod's containers.
    let args = ["debug", "shell", &image, "--target=nope", "-c", "lost"];
    let refused = kubectl_env(node, &[], &args, None);
    assert!(!refused.status.success());
    let err = text(&refused.stderr);
    assert!(err.contains(r#"spec.ephemeralContainers[1].targetContainerName: Not found: "nope""#), "{err}");
}

/// `kubectl top` without metrics-server: a busy pod shows its CPU within 30 s; the node endpoint
/// serves the Summary API and `/metrics/resource` the figures come from.
fn check_top(node: &Server) {
    run_pod(node, "busy", "yes > /dev/null");
    wait_ready(node, "busy");
    let millicores = |out: &str| -> Option<u64> {
        let cpu = out.split_whitespace().nth(1)?;
        cpu.strip_suffix('m').unwrap_or(cpu).parse().ok()
    };
    let busy = eventually(30, || {
        let out = kubectl_env(node, &[], &["top", "pod", "busy", "--no-headers"], None);
        millicores(&text(&out.stdout)).filter(|m| *m >= 100)
    });
    assert!(busy <= 1100, "one busy thread uses at most a core: {busy}m");
    let containers = node.ok(&["top", "pod", "busy", "--containers", "--no-headers"]);
    assert!(containers.starts_with("busy ") && containers.contains(" main "), "{containers}");
    let nodes = node.ok(&["top", "node", "--no-headers"]);
    let fields: Vec<&str> = nodes.split_whitespace().collect();
    assert!(fields.len() == 5 && fields[1].ends_with('m') && fields[3].ends_with("Mi"), "{nodes}");

    let port: u16 = node
        .ok(&["get", "nodes", "-o", "jsonpath={.items[0].status.daemonEndpoints.kubeletEndpoint.Port}"])
        .parse()
        .unwrap();
    let caller = Some("client-kube-apiserver-kubelet");
    let (code, body) = https_request(node, port, "GET", "/stats/summary", caller, &[]);
    assert_eq!(code, 200, "{body}");
    let summary: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(summary["node"]["memory"]["workingSetBytes"].as_u64().is_some_and(|b| b > 0), "{summary}");
    let pod = summary["pods"].as_array().unwrap().iter().find(|p| p["podRef"]["name"] == "busy").expect("busy");
    assert!(pod["cpu"]["usageNanoCores"].as_u64().is_some_and(|n| n >= 100_000_000), "{pod}");
    let (code, body) = https_request(node, port, "GET", "/metrics/resource", caller, &[]);
    assert_eq!(code, 200, "{body}");
    let line = r#"container_cpu_usage_seconds_total{container="main",namespace="default",pod="busy"}"#;
    assert!(body.lines().any(|l| l.starts_with(line)), "{body}");
    let (code, _) = https_request(node, port, "GET", "/stats/summary", Some("client-admin"), &[]);
    assert_eq!(code, 403, "only the API server may read the node's stats");
    // Through the API's node proxy, as users read them.
    let name = node.ok(&["get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"]);
    let raw = node.ok(&["get", "--raw", &format!("/api/v1/nodes/{name}/proxy/stats/summary")]);
    let proxied: serde_json::Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(proxied["node"]["nodeName"], name.as_str(), "{raw}");
    let raw = node.ok(&["get", "--raw", &format!("/api/v1/nodes/{name}/proxy/metrics/resource")]);
    assert!(raw.contains("# TYPE node_cpu_usage_seconds_total counter"), "{raw}");
    node.ok(&["delete", "pod", "busy", "--grace-period=0", "--force"]);
}

/// `-c` picks the container, the default-container annotation picks it without `-c`, and a
/// container that is not running is refused with kubelet's text.
fn check_containers(node: &Server) {
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: duo
  annotations: {{kubectl.kubernetes.io/default-container: side}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 0
  containers:
  - {{name: main, image: {BUSYBOX}, command: ["/bin/sh", "-c", "sleep 3600"], env: [{{name: WHO, value: main}}]}}
  - {{name: side, image: {BUSYBOX}, command: ["/bin/sh", "-c", "sleep 3600"], env: [{{name: WHO, value: side}}]}}
  - {{name: done, image: {BUSYBOX}, command: ["/bin/true"]}}
"#
    );
    node.ok_stdin(&["apply", "-f", "-"], &yaml);
    eventually(60, || {
        let out = node.ok(&["get", "pod", "duo", "-o", "jsonpath={.status.containerStatuses[*].state}"]);
        (out.matches("running").count() == 2 && out.contains("terminated")).then_some(())
    });
    let who = |args: &[&str]| text(&kubectl_env(node, &[], args, None).stdout);
    assert_eq!(who(&["exec", "duo", "--", "/bin/sh", "-c", "echo $WHO"]), "side\n");
    assert_eq!(who(&["exec", "duo", "-c", "main", "--", "/bin/sh", "-c", "echo $WHO"]), "main\n");
    for env in [vec![], vec![("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")]] {
        let gone = kubectl_env(node, &env, &["exec", "duo", "-c", "done", "--", "true"], None);
        assert!(!gone.status.success());
        assert!(
            text(&gone.stderr).contains(r#"unable to upgrade connection: container not found ("done")"#),
            "{env:?}: {}",
            text(&gone.stderr)
        );
    }
}

/// The streaming subresources are authenticated as any request, and check the pod first.
fn check_refusals(node: &Server) {
    let port: u16 = node.url.rsplit(':').next().unwrap().parse().unwrap();
    let upgrade =
        [("connection", "Upgrade"), ("upgrade", "SPDY/3.1"), ("x-stream-protocol-version", "v4.channel.k8s.io")];
    let path = "/api/v1/namespaces/default/pods/shell/exec?command=true&stdout=true";
    let (code, _) = https_request(node, port, "POST", path, None, &upgrade);
    assert_eq!(code, 401, "exec without credentials");
    let missing = "/api/v1/namespaces/default/pods/nopod/exec?command=true&stdout=true";
    let (code, body) = https_request(node, port, "POST", missing, Some("client-admin"), &upgrade);
    assert_eq!(code, 404, "{body}");
    assert!(body.contains(r#"pods \"nopod\" not found"#), "{body}");
    let (code, body) = https_request(node, port, "POST", path, Some("client-admin"), &[]);
    assert_eq!((code, body.contains("Upgrade request required")), (400, true), "{body}");
}

#[test]
fn exec_cp_and_port_forward_like_a_kubelet() {
    let node = Node::start(CIDR);
    eventually(60, || node_ready(&node));
    // The image is imported from the images directory while the node starts.
    eventually(60, || {
        node.ok(&["get", "nodes", "-o", "jsonpath={.items[0].status.images}"]).contains(BUSYBOX).then_some(())
    });
    run_pod(&node, "shell", "sleep 3600");
    run_pod(&node, "web", "mkdir -p /www && echo 'hello from web' > /www/index.html && exec httpd -f -p 80 -h /www");
    wait_ready(&node, "shell");
    wait_ready(&node, "web");

    // A session longer than kubectl's 61 s WebSocket ping deadline, beside the other checks: it
    // lasts only if the server answers kubectl's pings.
    let long = {
        let args = ["--kubeconfig", node.kubeconfig.to_str().unwrap(), "exec", "shell", "--"];
        let mut cmd = Command::new(common::kubectl_path());
        cmd.args(args).args(["/bin/sh", "-c", "sleep 65; echo survived"]);
        std::thread::spawn(move || cmd.output().unwrap())
    };
    check_exec(&node, &[]);
    check_exec(&node, &[("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")]);
    check_tty(&node, &[("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")]);
    check_tty(&node, &[]);
    check_attach(&node);
    check_containers(&node);
    check_refusals(&node);
    check_debug(&node);
    check_cp(&node, &[]);
    check_port_forward(&node, &[]);
    check_port_forward(&node, &[("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false")]);
    check_top(&node);
    let long = long.join().unwrap();
    assert_eq!(text(&long.stdout), "survived\n", "a 65 s session: {}", text(&long.stderr));
}
