//! Unit tests, and in-process integration tests that need root (they skip, saying so, otherwise).
//! The integration tests use bridges `cntest<N>`, subnets `10.199.<N>.0/24` of the cluster network
//! `10.199.0.0/16`, namespaces `cntest<N>-*` and iptables chains `CNTEST<N>-*`, and remove them.

use std::collections::HashSet;
use std::fs;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command as Proc, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::netfilter::{self, Snapshot};
use super::spec::{self, AddResult, Cidr, CniError, Conf, Dns, Env, Interface, IpConfig, Plugin, Route, code};
use super::*;

// ---------------------------------------------------------------------------------------------
// Configuration, environment, results and errors.

fn bridge_json() -> Value {
    json!({
        "cniVersion": "1.0.0", "name": "cairn", "type": "cairn-cni", "bridge": "cni0",
        "subnet": "10.42.0.0/24", "clusterCIDR": "10.42.0.0/16", "mtu": 1450, "hairpinMode": true,
        "ipMasq": true, "stateDir": "/var/lib/cairn/agent/cni",
    })
}

fn parse(v: &Value) -> Result<Conf, CniError> {
    Conf::parse(v.to_string().as_bytes())
}

fn bridge_of(c: Conf) -> spec::BridgeConf {
    match c.plugin {
        Plugin::Bridge(b) => b,
        Plugin::Loopback => panic!("not a bridge config"),
    }
}

#[test]
fn parses_bridge_config() {
    let mut v = bridge_json();
    v["runtimeConfig"] = json!({"portMappings": [
        {"hostPort": 8080, "containerPort": 80, "protocol": "TCP"},
        {"hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "192.0.2.2"},
        {"hostPort": 8443, "containerPort": 443, "hostIP": "0.0.0.0"},
        {"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "::"},
        {"hostPort": 0, "containerPort": 9000},
        // containerd 1.6's go-cni spelling.
        {"HostPort": 9090, "ContainerPort": 90, "Protocol": "tcp", "HostIP": ""},
    ]});
    v["prevResult"] = json!({"ips": []});
    let mut null_maps = bridge_json();
    null_maps["runtimeConfig"] = json!({"portMappings": null});
    assert!(bridge_of(parse(&null_maps).unwrap()).port_mappings.is_empty());
    let c = parse(&v).unwrap();
    assert_eq!((c.cni_version.as_str(), c.name.as_str()), ("1.0.0", "cairn"));
    assert!(c.prev_result.is_some());
    let b = bridge_of(c);
    assert_eq!(b.bridge, "cni0");
    assert_eq!(b.subnet, "10.42.0.0/24".parse().unwrap());
    assert_eq!(b.cluster, "10.42.0.0/16".parse().unwrap());
    assert_eq!((b.mtu, b.hairpin, b.ip_masq), (1450, true, true));
    assert_eq!(b.state_dir, Path::new("/var/lib/cairn/agent/cni"));
    assert_eq!(b.chain_prefix, "CAIRN");
    let maps: Vec<_> = b.port_mappings.iter().map(|m| (m.host_port, m.protocol.as_str(), m.host_ip.as_str())).collect();
    assert_eq!(maps, [(8080, "tcp", ""), (5353, "udp", "192.0.2.2"), (8443, "tcp", ""), (9090, "tcp", "")]);
}

#[test]
fn bridge_config_defaults_and_normalization() {
    let v = json!({"cniVersion": "0.3.1", "name": "n", "type": "cairn-cni", "subnet": "10.1.2.3/24"});
    let b = bridge_of(parse(&v).unwrap());
    assert_eq!(b.subnet.to_string(), "10.1.2.0/24");
    assert_eq!(b.cluster, b.subnet);
    assert_eq!((b.bridge.as_str(), b.mtu, b.hairpin, b.ip_masq), ("cni0", 1500, false, false));
    assert_eq!(b.state_dir, Path::new("/var/lib/cni/cairn"));
}

#[test]
fn parses_loopback_config() {
    let c = Conf::parse(br#"{"cniVersion":"0.3.1","name":"cni-loopback","type":"loopback"}"#).unwrap();
    assert_eq!(c.plugin, Plugin::Loopback);
}

#[test]
fn rejects_bad_configs() {
    let cases: Vec<(&str, Value, u32)> = vec![
        ("garbage", json!(null), code::DECODE),
        ("array", json!([1, 2]), code::DECODE),
        ("no type", json!({"cniVersion": "1.0.0", "name": "x"}), code::INVALID_CONFIG),
        ("unknown type", json!({"cniVersion": "1.0.0", "name": "x", "type": "flannel"}), code::INVALID_CONFIG),
        ("version", json!({"cniVersion": "2.0.0", "name": "x", "type": "loopback"}), code::INCOMPATIBLE_VERSION),
        ("no version", json!({"name": "x", "type": "loopback"}), code::INVALID_CONFIG),
    ];
    let mut bridge = vec![
        ("no subnet", json!({"subnet": null})),
        ("bad subnet", json!({"subnet": "10.42.0.0"})),
        ("bad prefix", json!({"subnet": "10.42.0.0/33"})),
        ("ipv6 subnet", json!({"subnet": "fd00::/64"})),
        ("tiny subnet", json!({"subnet": "10.42.0.0/31"})),
        ("cluster outside", json!({"clusterCIDR": "10.43.0.0/16"})),
        ("cluster smaller", json!({"clusterCIDR": "10.42.0.0/25"})),
        ("mtu type", json!({"mtu": "big"})),
        ("mtu range", json!({"mtu": 20})),
        ("name long", json!({"name": "cairn-network"})),
        ("name chars", json!({"name": "ca/rn"})),
        ("bridge long", json!({"bridge": "a-very-long-bridge"})),
        (
            "protocol",
            json!({"runtimeConfig": {"portMappings": [{"hostPort": 1, "containerPort": 1, "protocol": "icmp"}]}}),
        ),
        ("host ip", json!({"runtimeConfig": {"portMappings": [{"hostPort": 1, "containerPort": 1, "hostIP": "x"}]}})),
        ("port range", json!({"runtimeConfig": {"portMappings": [{"hostPort": 70000, "containerPort": 1}]}})),
        ("container port", json!({"runtimeConfig": {"portMappings": [{"hostPort": 80, "containerPort": 0}]}})),
    ];
    let mut all: Vec<(&str, Value, u32)> = cases;
    for (what, patch) in bridge.drain(..) {
        let mut v = bridge_json();
        for (k, val) in patch.as_object().unwrap() {
            v[k] = val.clone();
        }
        all.push((what, v, code::INVALID_CONFIG));
    }
    for (what, v, want) in all {
        let got = parse(&v).expect_err(what);
        assert_eq!(got.code, want, "{what}: {got:?}");
        assert!(!got.msg.is_empty(), "{what}");
    }
    assert_eq!(Conf::parse(b"\x00\xffnot json").unwrap_err().code, code::DECODE);
    assert_eq!(Conf::parse(b"").unwrap_err().code, code::DECODE);
}

#[test]
fn cidr_math() {
    let c: Cidr = "10.42.3.7/22".parse().unwrap();
    assert_eq!(c.network(), Ipv4Addr::new(10, 42, 0, 0));
    assert_eq!(c.broadcast(), Ipv4Addr::new(10, 42, 3, 255));
    assert_eq!(c.gateway(), Ipv4Addr::new(10, 42, 0, 1));
    assert!(c.contains(Ipv4Addr::new(10, 42, 2, 1)) && !c.contains(Ipv4Addr::new(10, 42, 4, 0)));
    assert_eq!(c.net().to_string(), "10.42.0.0/22");
    assert_eq!("0.0.0.0/0".parse::<Cidr>().unwrap().broadcast(), Ipv4Addr::BROADCAST);
    for bad in ["10.0.0.0", "10.0.0/8", "10.0.0.0/x", "10.0.0.0/40", "/8"] {
        assert!(bad.parse::<Cidr>().is_err(), "{bad}");
    }
}

fn env(cmd: &str, id: &str, netns: &str, ifname: &str) -> Env {
    Env { command: cmd.into(), container_id: id.into(), netns: netns.into(), ifname: ifname.into() }
}

#[test]
fn validates_env() {
    let e = |cmd, id, ns, ifn| {
        let env = env(cmd, id, ns, ifn);
        env.command().and_then(|c| env.validate(c)).map_err(|e| e.code)
    };
    assert_eq!(e("ADD", "abc", "/run/netns/x", "eth0"), Ok(()));
    assert_eq!(e("DEL", "abc", "", "eth0"), Ok(()));
    assert_eq!(e("", "abc", "/x", "eth0"), Err(code::INVALID_ENV));
    assert_eq!(e("FROB", "abc", "/x", "eth0"), Err(code::INVALID_ENV));
    assert_eq!(e("ADD", "", "/x", "eth0"), Err(code::INVALID_ENV));
    assert_eq!(e("ADD", "a\r\nb", "/x", "eth0"), Err(code::INVALID_ENV));
    assert_eq!(e("ADD", "abc", "", "eth0"), Err(code::INVALID_ENV));
    assert_eq!(e("CHECK", "abc", "", "eth0"), Err(code::INVALID_ENV));
    assert_eq!(e("ADD", "abc", "/x", ""), Err(code::INVALID_ENV));
    assert_eq!(e("ADD", "abc", "/x", "eth0/1"), Err(code::INVALID_ENV));
    assert_eq!(e("ADD", "abc", "/x", "a-name-too-long-for-linux"), Err(code::INVALID_ENV));
}

#[test]
fn version_and_minimal_commands() {
    let out = run(&env("VERSION", "", "", ""), b"").unwrap().unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v, json!({"cniVersion": "1.0.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0"]}));
    let lo = br#"{"cniVersion":"1.0.0","name":"lo","type":"loopback"}"#;
    assert_eq!(run(&env("STATUS", "", "", ""), lo), Ok(None));
    assert_eq!(run(&env("GC", "", "", ""), lo).unwrap_err().code, code::INVALID_ENV);
}

#[test]
fn garbage_and_missing_env_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // Garbage stdin: a decoding error, and nothing is created.
    let e = run(&env("ADD", "abc", "/nonexistent", "eth0"), b"{not json").unwrap_err();
    assert_eq!(e.code, code::DECODE);
    let mut v = bridge_json();
    v["stateDir"] = state.to_str().unwrap().into();
    // Missing environment: code 4, before anything is touched.
    let e = run(&env("ADD", "", "/nonexistent", "eth0"), v.to_string().as_bytes()).unwrap_err();
    assert_eq!(e.code, code::INVALID_ENV);
    let e = run(&env("", "abc", "/nonexistent", "eth0"), v.to_string().as_bytes()).unwrap_err();
    assert_eq!(e.code, code::INVALID_ENV);
    assert!(!state.exists());

    let j: Value = serde_json::from_str(&e.to_json("0.4.0")).unwrap();
    assert_eq!(j["cniVersion"], "0.4.0");
    assert_eq!(j["code"], 4);
    assert_eq!(j["msg"], "CNI_COMMAND is not set");
    assert!(j.get("details").is_some());
    assert_eq!(error_version(br#"{"cniVersion":"0.3.1"}"#), "0.3.1");
    assert_eq!(error_version(br#"{"cniVersion":"9.9.9"}"#), "1.0.0");
    assert_eq!(error_version(b"garbage"), "1.0.0");
}

#[test]
fn cni_error_code_survives_context() {
    let inner = CniError::new(code::IPAM_EXHAUSTED, "full", "all taken");
    let e = CniError::from(anyhow::Error::new(inner).context("allocating"));
    assert_eq!(e.code, code::IPAM_EXHAUSTED);
    assert_eq!(e.msg, "full");
    assert!(e.details.contains("allocating") && e.details.contains("all taken"), "{}", e.details);
    let e = CniError::from(anyhow!("boom").context("deleting"));
    assert_eq!((e.code, e.msg.as_str(), e.details.as_str()), (code::FAILED, "deleting", "deleting: boom"));
}

fn sample_result(version: &str) -> AddResult {
    let gw = Some(Ipv4Addr::new(10, 42, 0, 1).into());
    AddResult {
        cni_version: version.into(),
        interfaces: vec![
            Interface { name: "cni0".into(), mac: "02:00:00:00:00:01".into(), sandbox: None },
            Interface { name: "veth01234567".into(), mac: "02:00:00:00:00:02".into(), sandbox: None },
            Interface { name: "eth0".into(), mac: "02:00:00:00:00:03".into(), sandbox: Some("/run/netns/x".into()) },
        ],
        ips: vec![IpConfig::new(version, 2, "10.42.0.7/24".into(), false, gw)],
        routes: vec![Route { dst: "0.0.0.0/0".into(), gw }],
        dns: Dns {},
    }
}

#[test]
fn result_json_per_version() {
    let v: Value = serde_json::to_value(sample_result("1.0.0")).unwrap();
    assert_eq!(
        v,
        json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "cni0", "mac": "02:00:00:00:00:01"},
                {"name": "veth01234567", "mac": "02:00:00:00:00:02"},
                {"name": "eth0", "mac": "02:00:00:00:00:03", "sandbox": "/run/netns/x"},
            ],
            "ips": [{"interface": 2, "address": "10.42.0.7/24", "gateway": "10.42.0.1"}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.42.0.1"}],
            "dns": {},
        })
    );
    for old in ["0.3.0", "0.3.1", "0.4.0"] {
        let v: Value = serde_json::to_value(sample_result(old)).unwrap();
        assert_eq!(v["cniVersion"], old);
        assert_eq!(
            v["ips"][0],
            json!({"version": "4", "interface": 2, "address": "10.42.0.7/24", "gateway": "10.42.0.1"})
        );
    }
    let v6 = IpConfig::new("0.4.0", 0, "::1/128".into(), true, None);
    assert_eq!(serde_json::to_value(v6).unwrap(), json!({"version": "6", "interface": 0, "address": "::1/128"}));
}

// ---------------------------------------------------------------------------------------------
// IPAM.

fn subnet(s: &str) -> Cidr {
    s.parse().unwrap()
}

#[test]
fn ipam_round_robin_idempotency_and_release() {
    let dir = tempfile::tempdir().unwrap();
    let store = ipam::Store::open(dir.path(), "net").unwrap();
    let net = subnet("10.9.0.0/24");
    let ip = |o: u8| Ipv4Addr::new(10, 9, 0, o);
    assert_eq!(store.allocate(net, "a", "eth0").unwrap(), ip(2));
    assert_eq!(store.allocate(net, "b", "eth0").unwrap(), ip(3));
    assert_eq!(store.allocate(net, "a", "eth0").unwrap(), ip(2), "same container, same address");
    assert_eq!(store.allocate(net, "a", "eth1").unwrap(), ip(4), "another interface, another address");
    let file = dir.path().join("ipam/net/10.9.0.2");
    assert_eq!(fs::read_to_string(&file).unwrap(), "a\r\neth0");
    assert_eq!(fs::read_to_string(dir.path().join("ipam/net/last_reserved_ip.0")).unwrap(), "10.9.0.4");
    assert!(dir.path().join("ipam/net/lock").exists());

    assert_eq!(store.find("a", "eth0").unwrap(), Some(ip(2)));
    assert_eq!(store.release("a", "eth0").unwrap(), Some(ip(2)));
    assert!(!file.exists());
    assert_eq!(store.release("a", "eth0").unwrap(), None, "release is idempotent");
    assert_eq!(store.find("a", "eth0").unwrap(), None);
    // Round robin: the released .2 is not reused right away.
    assert_eq!(store.allocate(net, "c", "eth0").unwrap(), ip(5));
    // A fresh handle sees the same state.
    let again = ipam::Store::open(dir.path(), "net").unwrap();
    assert_eq!(again.find("b", "eth0").unwrap(), Some(ip(3)));
    // Files that are not addresses are ignored.
    fs::write(dir.path().join("ipam/net/.10.9.0.9.tmp"), "junk").unwrap();
    assert_eq!(again.allocate(net, "d", "eth0").unwrap(), ip(6));
}

#[test]
fn ipam_wraps_and_exhausts() {
    let dir = tempfile::tempdir().unwrap();
    let store = ipam::Store::open(dir.path(), "small").unwrap();
    // /29: .0 network, .1 gateway, .7 broadcast: .2 to .6 are pod addresses.
    let net = subnet("10.9.1.0/29");
    let got: Vec<u8> = (0..5).map(|i| store.allocate(net, &format!("c{i}"), "eth0").unwrap().octets()[3]).collect();
    assert_eq!(got, [2, 3, 4, 5, 6]);
    let err = CniError::from(store.allocate(net, "c5", "eth0").unwrap_err());
    assert_eq!(err.code, code::IPAM_EXHAUSTED);
    assert!(err.msg.contains("10.9.1.0/29"), "{err:?}");
    store.release("c1", "eth0").unwrap();
    assert_eq!(store.allocate(net, "c6", "eth0").unwrap(), Ipv4Addr::new(10, 9, 1, 3), "wraps to the freed address");
    // A last-reserved address outside the range (the subnet changed) restarts at the beginning.
    fs::write(dir.path().join("ipam/small/last_reserved_ip.0"), "192.168.0.1").unwrap();
    store.release("c3", "eth0").unwrap();
    assert_eq!(store.allocate(net, "c7", "eth0").unwrap(), Ipv4Addr::new(10, 9, 1, 5));
}

#[test]
fn ipam_concurrent_allocations_are_distinct() {
    let dir = tempfile::tempdir().unwrap();
    let threads = 32;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let (path, barrier) = (dir.path().to_path_buf(), barrier.clone());
            std::thread::spawn(move || {
                // Each thread opens the store itself: exclusion comes from flock, not from memory.
                let store = ipam::Store::open(&path, "conc").unwrap();
                barrier.wait();
                (0..4)
                    .map(|j| store.allocate(subnet("10.9.2.0/24"), &format!("t{i}-{j}"), "eth0").unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let all: Vec<Ipv4Addr> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let distinct: HashSet<_> = all.iter().collect();
    assert_eq!(distinct.len(), threads * 4);
    let files = fs::read_dir(dir.path().join("ipam/conc"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_str().unwrap().parse::<Ipv4Addr>().is_ok())
        .count();
    assert_eq!(files, threads * 4);
}

// ---------------------------------------------------------------------------------------------
// iptables plans (no iptables needed).

fn cairn_conf(ports: Value) -> spec::BridgeConf {
    let mut v = bridge_json();
    v["runtimeConfig"] = json!({ "portMappings": ports });
    bridge_of(parse(&v).unwrap())
}

#[test]
fn global_plan_is_complete_then_empty() {
    let c = cairn_conf(json!([]));
    let plan = netfilter::global_plan(&c, &Snapshot::default());
    assert_eq!(
        plan.nat,
        [
            ":CAIRN-POSTRTG - [0:0]",
            "-A CAIRN-POSTRTG -m mark --mark 0x2000/0x2000 -j MASQUERADE",
            "-A CAIRN-POSTRTG -s 10.42.0.0/16 ! -d 10.42.0.0/16 -j MASQUERADE",
            ":CAIRN-HOSTPORTS - [0:0]",
            "-I POSTROUTING 1 -j CAIRN-POSTRTG",
            "-I PREROUTING 1 -m addrtype --dst-type LOCAL -j CAIRN-HOSTPORTS",
            "-I OUTPUT 1 -m addrtype --dst-type LOCAL -j CAIRN-HOSTPORTS",
        ]
    );
    assert_eq!(plan.filter.len(), 7);
    // What iptables-save prints once that plan (and a container's host ports) is applied.
    let dump = "# Generated by iptables-save v1.8.9 (nf_tables)
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:CAIRN-FORWARD - [0:0]
:CAIRN-INPUT - [0:0]
-A INPUT -j CAIRN-INPUT
-A FORWARD -j CAIRN-FORWARD
-A FORWARD -j SOMETHING-ELSE
-A CAIRN-FORWARD -s 10.42.0.0/16 -j ACCEPT
-A CAIRN-FORWARD -d 10.42.0.0/16 -j ACCEPT
-A CAIRN-INPUT -d 127.0.0.0/8 -i cni0 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CAIRN-HOSTPORTS - [0:0]
:CAIRN-HP-0123456789abcdef - [0:0]
:CAIRN-POSTRTG - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j CAIRN-HOSTPORTS
-A OUTPUT -m addrtype --dst-type LOCAL -j CAIRN-HOSTPORTS
-A POSTROUTING -j CAIRN-POSTRTG
-A CAIRN-HOSTPORTS -j CAIRN-HP-0123456789abcdef
-A CAIRN-HP-0123456789abcdef -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.42.0.7:80
-A CAIRN-POSTRTG -m mark --mark 0x2000/0x2000 -j MASQUERADE
-A CAIRN-POSTRTG -s 10.42.0.0/16 ! -d 10.42.0.0/16 -j MASQUERADE
COMMIT
";
    let snap = Snapshot::parse(dump);
    assert!(netfilter::global_plan(&c, &snap).is_empty());

    // A changed cluster CIDR rewrites only the owned chains; a missing jump is put back alone.
    let mut other = c.clone();
    other.cluster = "10.40.0.0/14".parse().unwrap();
    let plan = netfilter::global_plan(&other, &snap);
    assert_eq!(plan.nat[0], ":CAIRN-POSTRTG - [0:0]");
    assert!(plan.nat.iter().all(|l| !l.contains("HOSTPORTS")), "{plan:?}");
    let snap = Snapshot::parse(&dump.replace("-A POSTROUTING -j CAIRN-POSTRTG\n", ""));
    let plan = netfilter::global_plan(&c, &snap);
    assert_eq!(plan.nat, ["-I POSTROUTING 1 -j CAIRN-POSTRTG"]);
    assert!(plan.filter.is_empty());
    assert_eq!(plan.render(), "*nat\n-I POSTROUTING 1 -j CAIRN-POSTRTG\nCOMMIT\n");
}

#[test]
fn hostport_lines_replace_and_remove() {
    let c = cairn_conf(json!([
        {"hostPort": 8080, "containerPort": 80},
        {"hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "192.0.2.2"},
    ]));
    let chain = netfilter::hostport_chain(&c, "0123456789abcdef0123");
    assert_eq!(chain, "CAIRN-HP-0123456789abcdef");
    assert!(chain.len() <= 28);
    let pod = Ipv4Addr::new(10, 42, 0, 7);
    let fresh = netfilter::hostport_lines(&c, &chain, pod, &c.port_mappings, &Snapshot::default().nat);
    assert_eq!(
        fresh,
        [
            ":CAIRN-HP-0123456789abcdef - [0:0]",
            "-A CAIRN-HP-0123456789abcdef -s 10.42.0.0/24 -p tcp -m tcp --dport 8080 -j MARK --set-xmark 0x2000/0x2000",
            "-A CAIRN-HP-0123456789abcdef -s 127.0.0.0/8 -p tcp -m tcp --dport 8080 -j MARK --set-xmark 0x2000/0x2000",
            "-A CAIRN-HP-0123456789abcdef -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.42.0.7:80",
            "-A CAIRN-HP-0123456789abcdef -s 10.42.0.0/24 -d 192.0.2.2/32 -p udp -m udp --dport 5353 -j MARK --set-xmark 0x2000/0x2000",
            "-A CAIRN-HP-0123456789abcdef -s 127.0.0.0/8 -d 192.0.2.2/32 -p udp -m udp --dport 5353 -j MARK --set-xmark 0x2000/0x2000",
            "-A CAIRN-HP-0123456789abcdef -d 192.0.2.2/32 -p udp -m udp --dport 5353 -j DNAT --to-destination 10.42.0.7:53",
            "-A CAIRN-HOSTPORTS -j CAIRN-HP-0123456789abcdef",
        ]
    );
    let existing = Snapshot::parse(
        "*nat\n:CAIRN-HOSTPORTS - [0:0]\n:CAIRN-HP-0123456789abcdef - [0:0]\n:CAIRN-HP-0123456789abcdef0 - [0:0]\n\
         -A CAIRN-HOSTPORTS -j CAIRN-HP-0123456789abcdef\n-A CAIRN-HOSTPORTS -j CAIRN-HP-0123456789abcdef0\nCOMMIT\n",
    );
    let again = netfilter::hostport_lines(&c, &chain, pod, &c.port_mappings, &existing.nat);
    assert_eq!(again[0], "-D CAIRN-HOSTPORTS -j CAIRN-HP-0123456789abcdef");
    assert_eq!(again[1..], fresh[..]);
    assert_eq!(
        netfilter::removal_lines(&chain, &existing.nat),
        [
            "-D CAIRN-HOSTPORTS -j CAIRN-HP-0123456789abcdef",
            "-F CAIRN-HP-0123456789abcdef",
            "-X CAIRN-HP-0123456789abcdef"
        ]
    );
    assert!(netfilter::removal_lines(&chain, &Snapshot::default().nat).is_empty());
}

// ---------------------------------------------------------------------------------------------
// install.

fn network_config(state: &Path) -> NetworkConfig {
    NetworkConfig {
        name: "cairn".into(),
        bridge: "cni0".into(),
        subnet: "10.42.0.0/24".parse().unwrap(),
        cluster_cidr: "10.42.0.0/16".parse().unwrap(),
        mtu: 1500,
        hairpin: true,
        ip_masq: true,
        state_dir: state.to_path_buf(),
    }
}

#[test]
fn install_writes_conflist_and_links_idempotently() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let (bin, conf, exe) = (dir.path().join("bin"), dir.path().join("net.d"), dir.path().join("cairn"));
    fs::write(&exe, "").unwrap();
    let cfg = network_config(Path::new("/var/lib/cairn/agent/cni"));
    install(&cfg, &exe, &bin, &conf).unwrap();

    let path = conf.join("10-cairn.conflist");
    let list: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(list["cniVersion"], "1.0.0");
    assert_eq!(list["name"], "cairn");
    let plugin = &list["plugins"][0];
    assert_eq!(plugin["type"], "cairn-cni");
    assert_eq!(plugin["capabilities"], json!({"portMappings": true}));
    // What libcni hands the plugin: the entry plus the list's name and version.
    let mut given = plugin.clone();
    given["name"] = list["name"].clone();
    given["cniVersion"] = list["cniVersion"].clone();
    let b = bridge_of(parse(&given).unwrap());
    assert_eq!((b.subnet.to_string(), b.cluster.to_string()), ("10.42.0.0/24".into(), "10.42.0.0/16".into()));
    assert_eq!((b.bridge.as_str(), b.mtu, b.hairpin, b.ip_masq), ("cni0", 1500, true, true));
    assert_eq!(b.state_dir, cfg.state_dir);
    for name in PLUGIN_NAMES {
        assert_eq!(fs::read_link(bin.join(name)).unwrap(), exe);
    }

    // Unchanged: nothing is rewritten.
    let before = (fs::metadata(&path).unwrap().ino(), fs::symlink_metadata(bin.join("loopback")).unwrap().ino());
    install(&cfg, &exe, &bin, &conf).unwrap();
    let after = (fs::metadata(&path).unwrap().ino(), fs::symlink_metadata(bin.join("loopback")).unwrap().ino());
    assert_eq!(before, after);

    // Changed config and a stale link / a foreign binary are replaced.
    fs::remove_file(bin.join("cairn-cni")).unwrap();
    std::os::unix::fs::symlink("/old/cairn", bin.join("cairn-cni")).unwrap();
    fs::remove_file(bin.join("loopback")).unwrap();
    fs::write(bin.join("loopback"), "reference plugin").unwrap();
    let changed = NetworkConfig { mtu: 1400, ..cfg.clone() };
    install(&changed, &exe, &bin, &conf).unwrap();
    assert!(fs::read_to_string(&path).unwrap().contains("1400"));
    for name in PLUGIN_NAMES {
        assert_eq!(fs::read_link(bin.join(name)).unwrap(), exe);
    }
    let leftovers: Vec<_> =
        fs::read_dir(&conf).unwrap().chain(fs::read_dir(&bin).unwrap()).map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 3, "no temporary files left: {leftovers:?}");

    // Invalid settings are refused before anything is written.
    let bad = NetworkConfig { name: "much-too-long".into(), ..cfg.clone() };
    assert!(install(&bad, &exe, &bin, &dir.path().join("other")).is_err());
    assert!(!dir.path().join("other").exists());
    let bad = NetworkConfig { cluster_cidr: "10.43.0.0/16".parse().unwrap(), ..cfg.clone() };
    assert!(install(&bad, &exe, &bin, &conf).is_err());
    assert!(install(&cfg, Path::new("relative/cairn"), &bin, &conf).is_err());
}

// ---------------------------------------------------------------------------------------------
// Integration: real bridges, namespaces and iptables (root only).

fn is_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipping {test}: needs root (CAP_NET_ADMIN, iptables)");
    }
    root
}

fn sh(args: &[&str]) -> std::process::Output {
    Proc::new(args[0]).args(&args[1..]).stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn sh_ok(args: &[&str]) -> String {
    let out = sh(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network namespace, deleted on drop.
struct Ns(String);

impl Ns {
    fn new(name: &str) -> Ns {
        let _ = sh(&["ip", "netns", "del", name]);
        sh_ok(&["ip", "netns", "add", name]);
        Ns(name.to_string())
    }

    fn path(&self) -> String {
        format!("/var/run/netns/{}", self.0)
    }

    fn exec(&self, args: &[&str]) -> std::process::Output {
        let mut all = vec!["ip", "netns", "exec", &self.0];
        all.extend_from_slice(args);
        sh(&all)
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = sh(&["ip", "netns", "del", &self.0]);
    }
}

/// A child process killed on drop (a server inside a namespace).
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `busybox nc` serving `reply` on every connection to `port` inside `ns`.
fn serve(ns: &Ns, port: u16, reply: &str) -> Server {
    let port = port.to_string();
    let child = Proc::new("ip")
        .args(["netns", "exec", &ns.0, "busybox", "nc", "-ll", "-p", &port, "-e", "echo", reply])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Server(child)
}

/// Connects to `addr port` (from `ns`, or the host) until it answers or 5 s pass; returns the answer.
fn fetch(ns: Option<&Ns>, addr: &str, port: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    let port = port.to_string();
    loop {
        let args = ["busybox", "nc", "-w", "2", addr, &port];
        let out = match ns {
            Some(ns) => ns.exec(&args),
            None => sh(&args),
        };
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !text.is_empty() || Instant::now() > deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A test network: bridge `cntest<n>`, subnet `10.199.<n>.0/24`, a temporary state dir; the
/// bridge and the network's iptables chains are removed on drop.
struct Net {
    n: u8,
    state: tempfile::TempDir,
}

impl Net {
    fn new(n: u8) -> Net {
        let net = Net { n, state: tempfile::tempdir().unwrap() };
        net.cleanup();
        net
    }

    fn name(&self) -> String {
        format!("cntest{}", self.n)
    }

    fn conf(&self, version: &str, ports: Value) -> Vec<u8> {
        json!({
            "cniVersion": version, "name": self.name(), "type": "cairn-cni", "bridge": self.name(),
            "subnet": format!("10.199.{}.0/24", self.n), "clusterCIDR": "10.199.0.0/16", "mtu": 1500,
            "hairpinMode": true, "ipMasq": true, "stateDir": self.state.path(),
            "runtimeConfig": { "portMappings": ports },
        })
        .to_string()
        .into_bytes()
    }

    fn run(&self, cmd: &str, id: &str, netns: &str, conf: &[u8]) -> Result<Option<String>, CniError> {
        run(&env(cmd, id, netns, "eth0"), conf)
    }

    fn add(&self, id: &str, ns: &Ns, ports: Value) -> Value {
        let out =
            self.run("ADD", id, &ns.path(), &self.conf("1.0.0", ports)).unwrap_or_else(|e| panic!("ADD {id}: {e:?}"));
        serde_json::from_str(&out.unwrap()).unwrap()
    }

    fn del(&self, id: &str, netns: &str) {
        self.run("DEL", id, netns, &self.conf("1.0.0", json!([]))).unwrap_or_else(|e| panic!("DEL {id}: {e:?}"));
    }

    fn ip_files(&self) -> usize {
        let dir = self.state.path().join("ipam").join(self.name());
        fs::read_dir(dir).map_or(0, |d| {
            d.filter(|e| e.as_ref().unwrap().file_name().to_str().unwrap().parse::<Ipv4Addr>().is_ok()).count()
        })
    }

    /// Our chains' lines of `iptables-save`.
    fn rules(&self) -> Vec<String> {
        let prefix = self.name().to_uppercase();
        sh_ok(&["iptables-save"]).lines().filter(|l| l.contains(&prefix)).map(str::to_string).collect()
    }

    fn cleanup(&self) {
        let _ = sh(&["ip", "link", "del", &self.name()]);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(netfilter::teardown_network(&self.name().to_uppercase())).unwrap();
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.cleanup();
    }
}

fn link_exists(name: &str) -> bool {
    sh(&["ip", "link", "show", name]).status.success()
}

fn pod_ip(result: &Value) -> String {
    result["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string()
}

/// The host's first global IPv4 address outside the test bridges.
fn host_ip() -> Option<String> {
    sh_ok(&["ip", "-4", "-o", "addr", "show", "scope", "global"])
        .lines()
        .filter(|l| !l.contains("cntest"))
        .find_map(|l| l.split_whitespace().nth(3)?.split('/').next().map(str::to_string))
}

#[test]
fn it_add_check_del() {
    if !is_root("it_add_check_del") {
        return;
    }
    let net = Net::new(1);
    let (a, b) = (Ns::new("cntest1-a"), Ns::new("cntest1-b"));
    let ra = net.add("ctr-a", &a, json!([]));
    // Another version: 0.3.1 results carry "version".
    let out = net.run("ADD", "ctr-b", &b.path(), &net.conf("0.3.1", json!([]))).unwrap().unwrap();
    let rb: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(rb["cniVersion"], "0.3.1");
    assert_eq!(rb["ips"][0]["version"], "4");

    let key = attachment_key("ctr-a", "eth0");
    let veth = super::host_veth(&key);
    assert_eq!(ra["cniVersion"], "1.0.0");
    assert_eq!(ra["interfaces"][0]["name"], "cntest1");
    assert_eq!(ra["interfaces"][1]["name"], veth.as_str());
    assert_eq!(ra["interfaces"][2]["name"], "eth0");
    assert_eq!(ra["interfaces"][2]["sandbox"], a.path().as_str());
    assert_eq!(ra["ips"][0]["gateway"], "10.199.1.1");
    assert_eq!(ra["ips"][0]["interface"], 2);
    assert!(ra["ips"][0].get("version").is_none());
    assert_eq!(ra["routes"], json!([{"dst": "0.0.0.0/0", "gw": "10.199.1.1"}]));
    for r in [&ra, &rb] {
        for i in r["interfaces"].as_array().unwrap() {
            assert_eq!(i["mac"].as_str().unwrap().len(), 17, "{i}");
        }
    }
    let (ipa, ipb) = (pod_ip(&ra), pod_ip(&rb));
    let octets: Vec<String> = ipa.split('.').map(|o| format!("{:02x}", o.parse::<u8>().unwrap())).collect();
    assert_eq!(ra["interfaces"][2]["mac"], format!("0a:58:{}", octets.join(":")));
    assert_ne!(ipa, ipb);

    // The pod side: address, MTU, up, default route.
    let addr = String::from_utf8_lossy(&a.exec(&["ip", "-4", "-o", "addr", "show", "eth0"]).stdout).into_owned();
    assert!(addr.contains(&format!("inet {ipa}/24")), "{addr}");
    let linkinfo = String::from_utf8_lossy(&a.exec(&["ip", "-o", "link", "show", "eth0"]).stdout).into_owned();
    assert!(linkinfo.contains("mtu 1500") && linkinfo.contains(",UP"), "{linkinfo}");
    let route = String::from_utf8_lossy(&a.exec(&["ip", "route", "show", "default"]).stdout).into_owned();
    assert!(route.contains("via 10.199.1.1 dev eth0"), "{route}");
    // The host side: on the bridge, hairpin, bridge has the gateway.
    assert!(fs::read_to_string(format!("/sys/class/net/{veth}/master/uevent")).unwrap().contains("INTERFACE=cntest1"));
    assert_eq!(fs::read_to_string(format!("/sys/class/net/{veth}/brport/hairpin_mode")).unwrap().trim(), "1");
    assert!(sh_ok(&["ip", "-4", "-o", "addr", "show", "cntest1"]).contains("inet 10.199.1.1/24"));
    assert_eq!(fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap().trim(), "1");

    // Traffic between the pods, and from the host to a pod.
    let ping = a.exec(&["busybox", "ping", "-c", "1", "-W", "2", &ipb]);
    assert!(ping.status.success(), "ping {ipb}: {}", String::from_utf8_lossy(&ping.stdout));
    let _srv = serve(&b, 8080, "hello-b");
    assert_eq!(fetch(Some(&a), &ipb, 8080), "hello-b");
    assert_eq!(fetch(None, &ipb, 8080), "hello-b");

    // CHECK passes, and fails when the address is gone.
    let conf = net.conf("1.0.0", json!([]));
    assert_eq!(net.run("CHECK", "ctr-a", &a.path(), &conf), Ok(None));
    let mut with_prev: Value = serde_json::from_slice(&conf).unwrap();
    with_prev["prevResult"] = ra.clone();
    assert_eq!(net.run("CHECK", "ctr-a", &a.path(), with_prev.to_string().as_bytes()), Ok(None));
    a.exec(&["ip", "addr", "flush", "dev", "eth0"]);
    assert_eq!(net.run("CHECK", "ctr-a", &a.path(), &conf).unwrap_err().code, code::FAILED);

    // DEL: veth and allocation gone; twice is fine; so is a vanished namespace.
    net.del("ctr-a", &a.path());
    assert!(!link_exists(&veth));
    assert!(!a.exec(&["ip", "link", "show", "eth0"]).status.success(), "the peer goes with the host side");
    assert_eq!(net.ip_files(), 1);
    net.del("ctr-a", &a.path());
    assert_eq!(net.run("CHECK", "ctr-a", &a.path(), &conf).unwrap_err().code, code::UNKNOWN_CONTAINER);
    drop(b);
    net.del("ctr-b", "/var/run/netns/cntest1-b");
    net.del("ctr-b", "");
    assert_eq!(net.ip_files(), 0);
    assert!(net.rules().iter().all(|r| !r.contains("-HP-")));
}

#[test]
fn it_host_ports() {
    if !is_root("it_host_ports") {
        return;
    }
    let net = Net::new(2);
    let pod = Ns::new("cntest2-pod");
    let other = Ns::new("cntest2-other");
    let ports = json!([{"hostPort": 31802, "containerPort": 8080, "protocol": "tcp"}]);
    let r = net.add("ctr-hp", &pod, ports.clone());
    net.add("ctr-other", &other, json!([]));
    let ip = pod_ip(&r);
    let chain = format!("CNTEST2-HP-{}", &attachment_key("ctr-hp", "eth0")[..16]);
    assert!(net.rules().iter().any(|l| l == &format!("-A CNTEST2-HOSTPORTS -j {chain}")), "{:?}", net.rules());
    assert_eq!(fs::read_to_string("/proc/sys/net/ipv4/conf/cntest2/route_localnet").unwrap().trim(), "1");

    let _srv = serve(&pod, 8080, "hello-hostport");
    assert_eq!(fetch(None, &ip, 8080), "hello-hostport", "direct");
    assert_eq!(fetch(None, "127.0.0.1", 31802), "hello-hostport", "via 127.0.0.1");
    assert_eq!(fetch(None, "10.199.2.1", 31802), "hello-hostport", "via the bridge address");
    match host_ip() {
        Some(host) => {
            assert_eq!(fetch(None, &host, 31802), "hello-hostport", "via the host's {host}");
            assert_eq!(fetch(Some(&pod), &host, 31802), "hello-hostport", "hairpin: the pod via the host port");
            assert_eq!(fetch(Some(&other), &host, 31802), "hello-hostport", "another pod via the host port");
        }
        None => eprintln!("it_host_ports: the host has no global IPv4 address; skipped those checks"),
    }

    // A repeated ADD keeps one chain and one jump.
    let again = net.add("ctr-hp", &pod, ports);
    assert_eq!(pod_ip(&again), ip);
    assert_eq!(net.rules().iter().filter(|l| l.ends_with(&format!("-j {chain}"))).count(), 1, "{:?}", net.rules());
    assert_eq!(fetch(None, "127.0.0.1", 31802), "hello-hostport", "after the repeated ADD");

    net.del("ctr-hp", &pod.path());
    assert!(net.rules().iter().all(|l| !l.contains(&chain)), "{:?}", net.rules());
    assert!(!net.state.path().join("hostports/cntest2").read_dir().unwrap().any(|_| true), "marker removed");
    // Without the allocation (state lost) DEL still finds the chain by its name.
    net.add("ctr-hp", &pod, json!([{"hostPort": 31802, "containerPort": 8080}]));
    fs::remove_dir_all(net.state.path().join("ipam")).unwrap();
    fs::remove_dir_all(net.state.path().join("hostports")).unwrap();
    net.del("ctr-hp", &pod.path());
    assert!(net.rules().iter().all(|l| !l.contains(&chain)), "{:?}", net.rules());
    net.del("ctr-hp", "");
}

#[test]
fn it_cycles_leak_nothing() {
    if !is_root("it_cycles_leak_nothing") {
        return;
    }
    let net = Net::new(3);
    let ns = Ns::new("cntest3-cycle");
    // The first ADD installs the network's shared rules; compare against the state after it.
    net.add("warmup", &ns, json!([]));
    net.del("warmup", &ns.path());
    let rules = net.rules();
    let ports = || sh_ok(&["ip", "-o", "link", "show", "master", "cntest3"]).lines().count();
    assert_eq!(ports(), 0);
    for i in 0..300 {
        let id = format!("cycle-{i}");
        let ports = if i % 3 == 0 { json!([{"hostPort": 31803, "containerPort": 80}]) } else { json!([]) };
        net.add(&id, &ns, ports);
        net.del(&id, &ns.path());
    }
    assert_eq!(net.ip_files(), 0);
    assert_eq!(ports(), 0);
    assert!((0..300).all(|i| !link_exists(&host_veth(&attachment_key(&format!("cycle-{i}"), "eth0")))));
    assert_eq!(net.rules(), rules);
    assert!(!ns.exec(&["ip", "link", "show", "eth0"]).status.success());
}

#[test]
fn it_failed_add_cleans_up() {
    if !is_root("it_failed_add_cleans_up") {
        return;
    }
    let net = Net::new(4);
    let e = net.run("ADD", "ctr-x", "/var/run/netns/cntest4-missing", &net.conf("1.0.0", json!([]))).unwrap_err();
    assert_eq!(e.code, code::FAILED);
    assert!(e.msg.contains("network namespace"), "{e:?}");
    // The pod's interface name is taken in its namespace: the veth cannot be created.
    let ns = Ns::new("cntest4-busy");
    assert!(ns.exec(&["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "other0"]).status.success());
    let e = net.run("ADD", "ctr-y", &ns.path(), &net.conf("1.0.0", json!([]))).unwrap_err();
    assert_eq!(e.code, code::FAILED, "{e:?}");
    assert_eq!(net.ip_files(), 0);
    assert!(!link_exists(&super::host_veth(&attachment_key("ctr-y", "eth0"))));
}

#[test]
fn it_loopback() {
    if !is_root("it_loopback") {
        return;
    }
    let ns = Ns::new("cntest-lo");
    let conf = br#"{"cniVersion":"0.4.0","name":"cni-loopback","type":"loopback"}"#;
    let e = env("CHECK", "ctr", &ns.path(), "lo");
    assert!(run(&e, conf).is_err(), "lo starts down");
    let out = run(&env("ADD", "ctr", &ns.path(), "lo"), conf).unwrap().unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["interfaces"], json!([{"name": "lo", "mac": "00:00:00:00:00:00", "sandbox": ns.path()}]));
    assert_eq!(v["ips"][0], json!({"version": "4", "interface": 0, "address": "127.0.0.1/8"}));
    assert!(String::from_utf8_lossy(&ns.exec(&["ip", "-o", "link", "show", "lo"]).stdout).contains("UP"));
    assert_eq!(run(&e, conf), Ok(None));
    assert_eq!(run(&env("DEL", "ctr", &ns.path(), "lo"), conf), Ok(None));
    assert_eq!(run(&env("DEL", "ctr", "", "lo"), conf), Ok(None));
}

/// Sets the FORWARD policy to DROP, and back to what it was on drop.
struct ForwardDrop(String);

impl ForwardDrop {
    fn new() -> ForwardDrop {
        let filter = sh_ok(&["iptables-save", "-t", "filter"]);
        let policy = filter.lines().find_map(|l| l.strip_prefix(":FORWARD ")?.split(' ').next().map(str::to_string));
        sh_ok(&["iptables", "-w", "-P", "FORWARD", "DROP"]);
        ForwardDrop(policy.unwrap_or_else(|| "ACCEPT".into()))
    }
}

impl Drop for ForwardDrop {
    fn drop(&mut self) {
        let _ = sh(&["iptables", "-w", "-P", "FORWARD", &self.0]);
    }
}

#[test]
fn it_masquerade_with_forward_drop() {
    if !is_root("it_masquerade_with_forward_drop") {
        return;
    }
    let net = Net::new(8);
    let pod = Ns::new("cntest8-pod");
    // "Outside": a namespace behind another host interface, with no route back to the pods, so
    // only masqueraded connections can be answered.
    let out = Ns::new("cntest8-out");
    let _ = sh(&["ip", "link", "del", "cntest8-up"]);
    sh_ok(&["ip", "link", "add", "cntest8-up", "type", "veth", "peer", "name", "eth0", "netns", &out.0]);
    sh_ok(&["ip", "addr", "add", "10.198.8.1/24", "dev", "cntest8-up"]);
    sh_ok(&["ip", "link", "set", "cntest8-up", "up"]);
    out.exec(&["ip", "addr", "add", "10.198.8.2/24", "dev", "eth0"]);
    out.exec(&["ip", "link", "set", "eth0", "up"]);
    let _srv = serve(&out, 8080, "hello-outside");

    let _policy = ForwardDrop::new();
    net.add("ctr-m", &pod, json!([]));
    assert_eq!(fetch(Some(&pod), "10.198.8.2", 8080), "hello-outside");
    net.del("ctr-m", &pod.path());
    let _ = sh(&["ip", "link", "del", "cntest8-up"]);
}
