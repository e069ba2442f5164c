//! The Service environment variables kubelet gives every container (pkg/kubelet/kubelet_pods.go
//! `getServiceEnvVarMap` and pkg/kubelet/envvars `FromServices`): `<NAME>_SERVICE_HOST`,
//! `<NAME>_SERVICE_PORT[_<PORT>]` and Docker's link variables `<NAME>_PORT[_<port>_<PROTO>[_PROTO|_PORT|_ADDR]]`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Service};

use super::env::EnvVars;

/// Services whose variables every pod gets, whatever `enableServiceLinks` says (upstream
/// `masterServices`, in the `default` namespace).
const MASTER_SERVICES: &[&str] = &["kubernetes"];

/// kubelet's `makeEnvVariableName`.
fn var_name(s: &str) -> String {
    s.replace('-', "_").to_uppercase()
}

/// kubelet's `IsServiceIPSet`: a ClusterIP that is neither empty nor `None`.
fn cluster_ip(svc: &Service) -> Option<&str> {
    let ip = svc.spec.as_ref()?.cluster_ip.as_deref()?;
    (!ip.is_empty() && ip != "None").then_some(ip)
}

/// `host:port`, bracketed for IPv6 (Go's `net.JoinHostPort`).
fn join_host_port(ip: &str, port: i32) -> String {
    if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") }
}

/// The variables of one Service (`FromServices` for one).
fn service_vars(svc: &Service, out: &mut BTreeMap<String, String>) {
    let (Some(ip), Some(name)) = (cluster_ip(svc), svc.metadata.name.as_deref()) else { return };
    let prefix = var_name(name);
    out.insert(format!("{prefix}_SERVICE_HOST"), ip.to_string());
    let ports = svc.spec.as_ref().and_then(|s| s.ports.as_deref()).unwrap_or_default();
    let Some(first) = ports.first() else { return };
    out.insert(format!("{prefix}_SERVICE_PORT"), first.port.to_string());
    for p in ports {
        if let Some(port_name) = p.name.as_deref().filter(|n| !n.is_empty()) {
            out.insert(format!("{prefix}_SERVICE_PORT_{}", var_name(port_name)), p.port.to_string());
        }
    }
    for (i, p) in ports.iter().enumerate() {
        let protocol = p.protocol.as_deref().filter(|s| !s.is_empty()).unwrap_or("TCP");
        let lower = protocol.to_lowercase();
        let url = format!("{lower}://{}", join_host_port(ip, p.port));
        if i == 0 {
            out.insert(format!("{prefix}_PORT"), url.clone());
        }
        let port_prefix = format!("{prefix}_PORT_{}_{}", p.port, protocol.to_uppercase());
        out.insert(format!("{port_prefix}_PROTO"), lower);
        out.insert(format!("{port_prefix}_PORT"), p.port.to_string());
        out.insert(format!("{port_prefix}_ADDR"), ip.to_string());
        out.insert(port_prefix, url);
    }
}

/// The Service variables of a pod in `namespace` from `services` (every Service the agent knows,
/// any namespace): the namespace's Services with a ClusterIP when `enable_service_links`, and
/// `default/kubernetes` always. A same-named Service of the pod's namespace wins over the master
/// one, as upstream's map does. Sorted by name; the container's own `env` overrides them.
pub fn service_env<'a>(
    namespace: &str,
    enable_service_links: bool,
    services: impl IntoIterator<Item = &'a Service>,
) -> EnvVars {
    let mut chosen: BTreeMap<&str, &Service> = BTreeMap::new();
    for svc in services {
        if cluster_ip(svc).is_none() {
            continue;
        }
        let (Some(ns), Some(name)) = (svc.metadata.namespace.as_deref(), svc.metadata.name.as_deref()) else {
            continue;
        };
        if ns == "default" && MASTER_SERVICES.contains(&name) {
            chosen.entry(name).or_insert(svc);
        } else if ns == namespace && enable_service_links {
            chosen.insert(name, svc);
        }
    }
    let mut vars = BTreeMap::new();
    for svc in chosen.values() {
        service_vars(svc, &mut vars);
    }
    vars.into_iter().collect()
}

/// [`service_env`] for `pod` (its namespace and `enableServiceLinks`, true when unset).
pub fn pod_service_env<'a>(pod: &Pod, services: impl IntoIterator<Item = &'a Service>) -> EnvVars {
    let links = pod.spec.as_ref().and_then(|s| s.enable_service_links).unwrap_or(true);
    service_env(pod.metadata.namespace.as_deref().unwrap_or("default"), links, services)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).expect("service")
    }

    fn services() -> Vec<Service> {
        vec![
            svc(json!({"metadata": {"name": "kubernetes", "namespace": "default"},
                "spec": {"clusterIP": "10.43.0.1", "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]}})),
            svc(json!({"metadata": {"name": "web", "namespace": "shop"},
                "spec": {"clusterIP": "10.43.0.20", "ports": [{"name": "http", "port": 80}, {"name": "metrics-port", "port": 9100, "protocol": "UDP"}]}})),
            svc(
                json!({"metadata": {"name": "my-db", "namespace": "shop"}, "spec": {"clusterIP": "fd00::5", "ports": [{"port": 5432}]}}),
            ),
            svc(
                json!({"metadata": {"name": "headless", "namespace": "shop"}, "spec": {"clusterIP": "None", "ports": [{"port": 1}]}}),
            ),
            svc(
                json!({"metadata": {"name": "ext", "namespace": "shop"}, "spec": {"type": "ExternalName", "externalName": "x.example"}}),
            ),
            svc(
                json!({"metadata": {"name": "other", "namespace": "elsewhere"}, "spec": {"clusterIP": "10.43.0.30", "ports": [{"port": 1}]}}),
            ),
        ]
    }

    fn get<'a>(vars: &'a EnvVars, name: &str) -> Option<&'a str> {
        vars.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn as_kubelet_sets_them() {
        let vars = service_env("shop", true, &services());
        let expect = [
            ("WEB_SERVICE_HOST", "10.43.0.20"),
            ("WEB_SERVICE_PORT", "80"),
            ("WEB_SERVICE_PORT_HTTP", "80"),
            ("WEB_SERVICE_PORT_METRICS_PORT", "9100"),
            ("WEB_PORT", "tcp://10.43.0.20:80"),
            ("WEB_PORT_80_TCP", "tcp://10.43.0.20:80"),
            ("WEB_PORT_80_TCP_PROTO", "tcp"),
            ("WEB_PORT_80_TCP_PORT", "80"),
            ("WEB_PORT_80_TCP_ADDR", "10.43.0.20"),
            ("WEB_PORT_9100_UDP", "udp://10.43.0.20:9100"),
            ("WEB_PORT_9100_UDP_PROTO", "udp"),
            ("MY_DB_SERVICE_HOST", "fd00::5"),
            ("MY_DB_SERVICE_PORT", "5432"),
            ("MY_DB_PORT", "tcp://[fd00::5]:5432"),
            ("KUBERNETES_SERVICE_HOST", "10.43.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
            ("KUBERNETES_PORT", "tcp://10.43.0.1:443"),
            ("KUBERNETES_PORT_443_TCP_ADDR", "10.43.0.1"),
        ];
        for (name, value) in expect {
            assert_eq!(get(&vars, name), Some(value), "{name}");
        }
        // Headless and ExternalName Services (no ClusterIP) and other namespaces' get none.
        assert!(
            vars.iter().all(|(n, _)| !n.starts_with("HEADLESS_") && !n.starts_with("EXT_") && !n.starts_with("OTHER_"))
        );
        assert_eq!(vars.iter().filter(|(n, _)| n.starts_with("WEB_")).count(), 4 + 1 + 2 * 4);
        let mut sorted = vars.clone();
        sorted.sort();
        assert_eq!(sorted, vars);
    }

    #[test]
    fn service_links_off_keeps_the_master_service() {
        let vars = service_env("shop", false, &services());
        assert!(vars.iter().all(|(n, _)| n.starts_with("KUBERNETES_")), "{vars:?}");
        assert_eq!(get(&vars, "KUBERNETES_SERVICE_HOST"), Some("10.43.0.1"));
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "shop"},
            "spec": {"enableServiceLinks": false, "containers": []}}))
        .expect("pod");
        assert_eq!(pod_service_env(&pod, &services()), vars);
        // The pod's namespace's own `kubernetes` Service wins over the master one.
        let mut all = services();
        all.push(svc(json!({"metadata": {"name": "kubernetes", "namespace": "shop"},
            "spec": {"clusterIP": "10.43.0.99", "ports": [{"port": 1}]}})));
        assert_eq!(get(&service_env("shop", true, &all), "KUBERNETES_SERVICE_HOST"), Some("10.43.0.99"));
        assert_eq!(get(&service_env("shop", false, &all), "KUBERNETES_SERVICE_HOST"), Some("10.43.0.1"));
    }
}
