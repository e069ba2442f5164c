use std::str::FromStr as _;

use serde_json::json;

use super::*;

pub(crate) fn svc(v: serde_json::Value) -> Service {
    serde_json::from_value(v).expect("service fixture")
}

pub(crate) fn slice(v: serde_json::Value) -> EndpointSlice {
    serde_json::from_value(v).expect("slice fixture")
}

fn ns(name: &str) -> Namespace {
    serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace fixture")
}

/// The fixture every test reads: a ClusterIP Service with two named ports, a dual-stack one, a
/// headless one with a hostname endpoint, a not-ready endpoint and an unnamed one, a headless one
/// publishing not-ready addresses, an ExternalName, and an empty namespace.
pub(crate) fn fixture() -> RecordSet {
    fixture_with(Vec::new(), Vec::new())
}

/// [`fixture`] with more Services and slices.
pub(crate) fn fixture_with(more_services: Vec<Service>, more_slices: Vec<EndpointSlice>) -> RecordSet {
    let mut services = vec![
        svc(json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIP": "10.43.0.20", "clusterIPs": ["10.43.0.20"],
                "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"name": "dns", "port": 53, "protocol": "UDP"}]}})),
        svc(json!({"metadata": {"name": "dual", "namespace": "default"},
            "spec": {"clusterIP": "10.43.0.21", "clusterIPs": ["10.43.0.21", "fd00:43::21"],
                "ports": [{"name": "http", "port": 8080}]}})),
        svc(json!({"metadata": {"name": "db", "namespace": "data"},
            "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]}})),
        svc(json!({"metadata": {"name": "lazy", "namespace": "data"},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": true}})),
        svc(json!({"metadata": {"name": "ext", "namespace": "default"},
            "spec": {"type": "ExternalName", "externalName": "db.example.org"}})),
    ];
    let mut slices = vec![
        slice(json!({"metadata": {"name": "db-abc", "namespace": "data", "labels": {SERVICE_NAME_LABEL: "db"}},
            "addressType": "IPv4",
            "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.42.0.5"], "hostname": "db-0", "conditions": {"ready": true}},
                {"addresses": ["10.42.0.6"], "conditions": {}},
                {"addresses": ["10.42.0.7"], "hostname": "db-2", "conditions": {"ready": false}}]})),
        slice(json!({"metadata": {"name": "lazy-x", "namespace": "data", "labels": {SERVICE_NAME_LABEL: "lazy"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.42.0.9"], "conditions": {"ready": false}}]})),
        slice(json!({"metadata": {"name": "web-x", "namespace": "default", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["10.42.0.30"], "conditions": {"ready": true}}]})),
        // A slice of a Service that does not exist is ignored.
        slice(json!({"metadata": {"name": "gone-x", "namespace": "default", "labels": {SERVICE_NAME_LABEL: "gone"}},
            "addressType": "IPv4", "endpoints": [{"addresses": ["10.42.0.99"]}]})),
    ];
    services.extend(more_services);
    slices.extend(more_slices);
    let namespaces = [ns("default"), ns("data"), ns("empty")];
    RecordSet::build("cluster.local", 42, &namespaces, &services, &slices).expect("record set")
}

fn name(s: &str) -> Name {
    Name::from_str(s).expect("name")
}

fn answer(set: &RecordSet, q: &str, t: RecordType) -> Answer {
    match set.lookup(&name(q), t) {
        Lookup::Answer(a) => a,
        other => panic!("{q} {t}: expected an answer, got {other:?}"),
    }
}

fn data(records: &[Record]) -> Vec<String> {
    let mut v: Vec<String> = records.iter().map(|r| format!("{} {} {}", r.name, r.record_type(), r.data)).collect();
    v.sort();
    v
}

fn assert_soa(a: &Answer) {
    assert_eq!(a.authority.len(), 1, "SOA in authority: {a:?}");
    let soa = &a.authority[0];
    assert_eq!(soa.record_type(), RecordType::SOA);
    assert_eq!(soa.name, name("cluster.local."));
    assert_eq!(soa.ttl, TTL);
    assert!(soa.data.to_string().starts_with("ns.dns.cluster.local. hostmaster.cluster.local. "), "{}", soa.data);
}

fn assert_nxdomain(set: &RecordSet, q: &str, t: RecordType) {
    let a = answer(set, q, t);
    assert_eq!(a.rcode, ResponseCode::NXDomain, "{q}");
    assert!(a.answers.is_empty());
    assert_soa(&a);
}

fn assert_nodata(set: &RecordSet, q: &str, t: RecordType) {
    let a = answer(set, q, t);
    assert_eq!(a.rcode, ResponseCode::NoError, "{q}");
    assert!(a.answers.is_empty(), "{q}: {:?}", a.answers);
    assert_soa(&a);
}

#[test]
fn cluster_ip_a_and_aaaa() {
    let set = fixture();
    let a = answer(&set, "web.default.svc.cluster.local.", RecordType::A);
    assert_eq!(a.rcode, ResponseCode::NoError);
    assert_eq!(data(&a.answers), ["web.default.svc.cluster.local. A 10.43.0.20"]);
    assert!(a.authority.is_empty());
    assert!(a.answers.iter().all(|r| r.ttl == TTL));
    // Case does not matter.
    let a = answer(&set, "WEB.Default.svc.Cluster.Local.", RecordType::A);
    assert_eq!(data(&a.answers).len(), 1);
    assert!(data(&a.answers)[0].ends_with(" A 10.43.0.20"));
    // The SOA serial is the one the set was built with.
    let soa = set.soa();
    assert!(soa.data.to_string().contains(". 42 7200 1800 86400 5"), "{}", soa.data);
    let a = answer(&set, "dual.default.svc.cluster.local.", RecordType::AAAA);
    assert_eq!(data(&a.answers), ["dual.default.svc.cluster.local. AAAA fd00:43::21"]);
    let a = answer(&set, "dual.default.svc.cluster.local.", RecordType::A);
    assert_eq!(data(&a.answers), ["dual.default.svc.cluster.local. A 10.43.0.21"]);
    // A single-stack Service has no AAAA: NODATA.
    assert_nodata(&set, "web.default.svc.cluster.local.", RecordType::AAAA);
    assert_nodata(&set, "web.default.svc.cluster.local.", RecordType::TXT);
    assert_nodata(&set, "web.default.svc.cluster.local.", RecordType::MX);
}

#[test]
fn headless_answers_ready_endpoints() {
    let set = fixture();
    let a = answer(&set, "db.data.svc.cluster.local.", RecordType::A);
    assert_eq!(
        data(&a.answers),
        ["db.data.svc.cluster.local. A 10.42.0.5", "db.data.svc.cluster.local. A 10.42.0.6"],
        "the not-ready endpoint is left out"
    );
    // publishNotReadyAddresses, and a slice without ports: A still answers.
    let a = answer(&set, "lazy.data.svc.cluster.local.", RecordType::A);
    assert_eq!(data(&a.answers), ["lazy.data.svc.cluster.local. A 10.42.0.9"]);
    assert_nodata(&set, "lazy.data.svc.cluster.local.", RecordType::SRV);
}

#[test]
fn endpoint_names() {
    let set = fixture();
    let a = answer(&set, "db-0.db.data.svc.cluster.local.", RecordType::A);
    assert_eq!(data(&a.answers), ["db-0.db.data.svc.cluster.local. A 10.42.0.5"]);
    // An endpoint without hostname is named by its address.
    let a = answer(&set, "10-42-0-6.db.data.svc.cluster.local.", RecordType::A);
    assert_eq!(data(&a.answers), ["10-42-0-6.db.data.svc.cluster.local. A 10.42.0.6"]);
    // A ClusterIP Service's endpoints are named too (CoreDNS answers endpoint queries for any Service).
    let a = answer(&set, "10-42-0-30.web.default.svc.cluster.local.", RecordType::A);
    assert_eq!(data(&a.answers), ["10-42-0-30.web.default.svc.cluster.local. A 10.42.0.30"]);
    assert_nxdomain(&set, "db-2.db.data.svc.cluster.local.", RecordType::A);
    assert_nxdomain(&set, "nope.db.data.svc.cluster.local.", RecordType::A);
    assert_nxdomain(&set, "x.ext.default.svc.cluster.local.", RecordType::A);
}

#[test]
fn srv_records() {
    let set = fixture();
    let a = answer(&set, "_http._tcp.web.default.svc.cluster.local.", RecordType::SRV);
    assert_eq!(
        data(&a.answers),
        ["_http._tcp.web.default.svc.cluster.local. SRV 0 100 80 web.default.svc.cluster.local."]
    );
    assert_eq!(data(&a.additionals), ["web.default.svc.cluster.local. A 10.43.0.20"]);
    let a = answer(&set, "_dns._udp.web.default.svc.cluster.local.", RecordType::SRV);
    assert_eq!(
        data(&a.answers),
        ["_dns._udp.web.default.svc.cluster.local. SRV 0 100 53 web.default.svc.cluster.local."]
    );
    // The plain name answers SRV for every port.
    let a = answer(&set, "web.default.svc.cluster.local.", RecordType::SRV);
    assert_eq!(a.answers.len(), 2);
    assert!(data(&a.answers).iter().all(|s| s.contains(" SRV 0 50 ")), "{:?}", data(&a.answers));
    // A port with the wrong protocol, or unknown: NXDOMAIN.
    assert_nxdomain(&set, "_http._udp.web.default.svc.cluster.local.", RecordType::SRV);
    assert_nxdomain(&set, "_nope._tcp.web.default.svc.cluster.local.", RecordType::SRV);
    // Headless: one SRV per endpoint, pointing at its name.
    let a = answer(&set, "_pg._tcp.db.data.svc.cluster.local.", RecordType::SRV);
    assert_eq!(
        data(&a.answers),
        [
            "_pg._tcp.db.data.svc.cluster.local. SRV 0 50 5432 10-42-0-6.db.data.svc.cluster.local.",
            "_pg._tcp.db.data.svc.cluster.local. SRV 0 50 5432 db-0.db.data.svc.cluster.local.",
        ]
    );
    assert_eq!(
        data(&a.additionals),
        ["10-42-0-6.db.data.svc.cluster.local. A 10.42.0.6", "db-0.db.data.svc.cluster.local. A 10.42.0.5"]
    );
    // The SRV name answers A too (the port selects the records).
    let a = answer(&set, "_pg._tcp.db.data.svc.cluster.local.", RecordType::A);
    assert_eq!(a.answers.len(), 2);
}

#[test]
fn external_name_is_a_cname() {
    let set = fixture();
    let q = name("ext.default.svc.cluster.local.");
    match set.lookup(&q, RecordType::A) {
        Lookup::Alias { cname, target } => {
            assert_eq!(target, name("db.example.org."));
            assert_eq!(data(&[*cname]), ["ext.default.svc.cluster.local. CNAME db.example.org."]);
        }
        other => panic!("expected an alias, got {other:?}"),
    }
    assert!(matches!(set.lookup(&q, RecordType::AAAA), Lookup::Alias { .. }));
    let a = answer(&set, "ext.default.svc.cluster.local.", RecordType::CNAME);
    assert_eq!(data(&a.answers), ["ext.default.svc.cluster.local. CNAME db.example.org."]);
}

#[test]
fn pod_records() {
    let set = fixture();
    let a = answer(&set, "10-42-1-7.default.pod.cluster.local.", RecordType::A);
    assert_eq!(data(&a.answers), ["10-42-1-7.default.pod.cluster.local. A 10.42.1.7"]);
    let a = answer(&set, "fd00--7.empty.pod.cluster.local.", RecordType::AAAA);
    assert_eq!(data(&a.answers), ["fd00--7.empty.pod.cluster.local. AAAA fd00::7"]);
    assert_nodata(&set, "10-42-1-7.default.pod.cluster.local.", RecordType::AAAA);
    assert_nxdomain(&set, "10-42-1-7.nope.pod.cluster.local.", RecordType::A);
    assert_nxdomain(&set, "not-an-ip.default.pod.cluster.local.", RecordType::A);
    assert_nxdomain(&set, "10-42-1-999.default.pod.cluster.local.", RecordType::A);
    assert_nxdomain(&set, "x.10-42-1-7.default.pod.cluster.local.", RecordType::A);
}

#[test]
fn ptr_records() {
    let set = fixture();
    let a = answer(&set, "20.0.43.10.in-addr.arpa.", RecordType::PTR);
    assert_eq!(data(&a.answers), ["20.0.43.10.in-addr.arpa. PTR web.default.svc.cluster.local."]);
    let a = answer(&set, "5.0.42.10.in-addr.arpa.", RecordType::PTR);
    assert_eq!(data(&a.answers), ["5.0.42.10.in-addr.arpa. PTR db-0.db.data.svc.cluster.local."]);
    let a = answer(&set, "6.0.42.10.in-addr.arpa.", RecordType::PTR);
    assert_eq!(data(&a.answers), ["6.0.42.10.in-addr.arpa. PTR 10-42-0-6.db.data.svc.cluster.local."]);
    let v6 = "1.2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.3.4.0.0.0.0.d.f.ip6.arpa.";
    let a = answer(&set, v6, RecordType::PTR);
    assert_eq!(data(&a.answers), [format!("{v6} PTR dual.default.svc.cluster.local.")]);
    // Addresses that are not the cluster's, and partial reverse names, go upstream.
    assert_eq!(set.lookup(&name("1.1.168.192.in-addr.arpa."), RecordType::PTR), Lookup::Forward);
    assert_eq!(set.lookup(&name("43.10.in-addr.arpa."), RecordType::PTR), Lookup::Forward);
}

#[test]
fn nxdomain_and_nodata_inside_the_domain() {
    let set = fixture();
    assert_nxdomain(&set, "nope.default.svc.cluster.local.", RecordType::A);
    assert_nxdomain(&set, "web.nope.svc.cluster.local.", RecordType::A);
    assert_nxdomain(&set, "web.default.other.cluster.local.", RecordType::A);
    assert_nxdomain(&set, "a.b.c.web.default.svc.cluster.local.", RecordType::A);
    // ndots:5 search expansion of an outside name.
    assert_nxdomain(&set, "example.com.default.svc.cluster.local.", RecordType::A);
    assert_nxdomain(&set, "www.example.com.svc.cluster.local.", RecordType::A);
    // Existing names without records.
    assert_nodata(&set, "cluster.local.", RecordType::A);
    assert_nodata(&set, "svc.cluster.local.", RecordType::A);
    assert_nodata(&set, "pod.cluster.local.", RecordType::A);
    assert_nodata(&set, "empty.svc.cluster.local.", RecordType::A);
    assert_nodata(&set, "default.pod.cluster.local.", RecordType::A);
    let a = answer(&set, "cluster.local.", RecordType::SOA);
    assert_eq!(a.answers.len(), 1);
    assert_eq!(a.answers[0].record_type(), RecordType::SOA);
    let a = answer(&set, "cluster.local.", RecordType::NS);
    assert_eq!(data(&a.answers), ["cluster.local. NS ns.dns.cluster.local."]);
}

#[test]
fn outside_names_are_forwarded() {
    let set = fixture();
    assert_eq!(set.lookup(&name("example.com."), RecordType::A), Lookup::Forward);
    assert_eq!(set.lookup(&name("local."), RecordType::A), Lookup::Forward);
    assert_eq!(set.lookup(&name("."), RecordType::NS), Lookup::Forward);
    assert_eq!(set.lookup(&name("notcluster.local."), RecordType::A), Lookup::Forward);
}

#[test]
fn empty_set_and_bad_domain() {
    let set = RecordSet::empty("cluster.local").expect("empty");
    assert_nxdomain(&set, "web.default.svc.cluster.local.", RecordType::A);
    assert_eq!(set.service_count(), 0);
    assert_eq!(fixture().service_count(), 5);
    assert!(RecordSet::empty("bad..domain").is_err());
}
