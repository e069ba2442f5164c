//! What a request asks to do, read from its method, path and query alone (upstream's
//! `RequestInfoFactory`): the attributes every authorizer decides on.

use super::super::User;

/// A request's attributes (upstream's `authorizer.Attributes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    pub verb: String,
    /// Absent for a non-resource request (`/healthz`, `/api`, `/metrics`).
    pub resource: Option<ResourceAttributes>,
    pub path: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceAttributes {
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    /// The object's name; for a list or watch, the one an exact `metadata.name` field selector names.
    pub name: String,
    /// The `fieldSelector` of a list or watch, as `(field, value)` equality requirements.
    pub field_equals: Vec<(String, String)>,
}

/// Verbs that come first in the path instead of from the method.
const PATH_VERBS: &[&str] = &["proxy", "watch"];
/// Namespace subresources: `/api/v1/namespaces/{name}/status` is the namespace's own.
const NAMESPACE_SUBRESOURCES: &[&str] = &["status", "finalize"];

impl Attributes {
    pub fn of(method: &http::Method, path: &str, query: Option<&str>) -> Self {
        let verb_of_method = match *method {
            http::Method::POST => "create",
            http::Method::GET | http::Method::HEAD => "get",
            http::Method::PUT => "update",
            http::Method::PATCH => "patch",
            http::Method::DELETE => "delete",
            _ => "",
        };
        let non_resource =
            || Attributes { verb: method.as_str().to_lowercase(), resource: None, path: path.to_string() };
        let parts: Vec<&str> = path.trim_matches('/').split('/').filter(|p| !p.is_empty()).collect();
        let (group, mut rest) = match parts.as_slice() {
            ["api", _version, rest @ ..] if !rest.is_empty() => ("", rest),
            ["apis", group, _version, rest @ ..] if !rest.is_empty() => (*group, rest),
            _ => return non_resource(),
        };
        let mut verb = verb_of_method.to_string();
        if let [first, tail @ ..] = rest
            && PATH_VERBS.contains(first)
            && !tail.is_empty()
        {
            verb = first.to_string();
            rest = tail;
        }
        let mut r = ResourceAttributes { group: group.to_string(), ..Default::default() };
        if let ["namespaces", ns, tail @ ..] = rest {
            r.namespace = ns.to_string();
            if !tail.is_empty() && !NAMESPACE_SUBRESOURCES.contains(&tail[0]) {
                rest = tail;
            }
        }
        match rest {
            [res, name, sub, ..] if verb != "proxy" => {
                (r.resource, r.name, r.subresource) = (res.to_string(), name.to_string(), sub.to_string());
            }
            [res, name, ..] => (r.resource, r.name) = (res.to_string(), name.to_string()),
            [res] => r.resource = res.to_string(),
            [] => {}
        }
        let pairs: Vec<(String, String)> =
            form_urlencoded::parse(query.unwrap_or_default().as_bytes()).into_owned().collect();
        let param = |k: &str| pairs.iter().rev().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        if r.name.is_empty() && verb == "get" {
            verb = if matches!(param("watch"), Some("true" | "1")) { "watch" } else { "list" }.into();
        }
        if verb == "list" || verb == "watch" {
            r.field_equals = field_equals(param("fieldSelector").unwrap_or_default());
            if r.name.is_empty()
                && let Some((_, name)) = r.field_equals.iter().find(|(f, _)| f == "metadata.name")
                && !name.contains('/')
            {
                r.name = name.clone();
            }
        }
        if r.name.is_empty() && verb == "delete" {
            verb = "deletecollection".into();
        }
        Attributes { verb, resource: Some(r), path: path.to_string() }
    }

    /// `resource` or `resource/subresource`, as rules name it.
    pub fn combined_resource(&self) -> Option<String> {
        self.resource.as_ref().map(|r| {
            if r.subresource.is_empty() { r.resource.clone() } else { format!("{}/{}", r.resource, r.subresource) }
        })
    }

    /// Upstream's forbidden text: `User "u" cannot get resource "pods" in API group "" in the
    /// namespace "n"` (or `at the cluster scope`, or `cannot get path "/p"`).
    pub fn forbidden_message(&self, user: &User) -> String {
        let Some(r) = &self.resource else {
            return format!("User {:?} cannot {} path {:?}", user.name, self.verb, self.path);
        };
        let resource = self.combined_resource().unwrap_or_default();
        let scope = if r.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace {:?}", r.namespace)
        };
        format!("User {:?} cannot {} resource {resource:?} in API group {:?} {scope}", user.name, self.verb, r.group)
    }
}

/// The equality requirements of a field selector (`a=b`, `a==b`); others are left out.
fn field_equals(selector: &str) -> Vec<(String, String)> {
    selector
        .split(',')
        .filter(|term| !term.contains("!="))
        .filter_map(|term| term.split_once("==").or_else(|| term.split_once('=')))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn res(method: Method, path: &str, query: Option<&str>) -> (String, ResourceAttributes) {
        let a = Attributes::of(&method, path, query);
        (a.verb, a.resource.expect("a resource request"))
    }

    #[test]
    fn paths_become_attributes_as_upstream() {
        let (verb, r) = res(Method::GET, "/api/v1/namespaces/ns/pods/p", None);
        assert_eq!(
            (verb.as_str(), r.resource.as_str(), r.namespace.as_str(), r.name.as_str()),
            ("get", "pods", "ns", "p")
        );
        let (verb, r) = res(Method::GET, "/api/v1/pods", Some("watch=true&fieldSelector=spec.nodeName%3Dn1"));
        assert_eq!(verb, "watch");
        assert_eq!(r.field_equals, [("spec.nodeName".to_string(), "n1".to_string())]);
        let (verb, r) =
            res(Method::GET, "/api/v1/watch/namespaces/ns/secrets", Some("fieldSelector=metadata.name%3Ds"));
        assert_eq!((verb.as_str(), r.resource.as_str(), r.name.as_str()), ("watch", "secrets", "s"));
        let (verb, r) = res(Method::PUT, "/api/v1/namespaces/ns/pods/p/status", None);
        assert_eq!((verb.as_str(), r.subresource.as_str()), ("update", "status"));
        let (verb, r) = res(Method::PUT, "/api/v1/namespaces/ns/status", None);
        assert_eq!(
            (verb.as_str(), r.resource.as_str(), r.name.as_str(), r.subresource.as_str()),
            ("update", "namespaces", "ns", "status")
        );
        let (verb, r) = res(Method::GET, "/api/v1/namespaces/ns", None);
        assert_eq!((verb.as_str(), r.resource.as_str(), r.name.as_str()), ("get", "namespaces", "ns"));
        let (verb, r) = res(Method::DELETE, "/apis/apps/v1/namespaces/ns/deployments", None);
        assert_eq!((verb.as_str(), r.group.as_str(), r.resource.as_str()), ("deletecollection", "apps", "deployments"));
        let (verb, r) = res(Method::GET, "/api/v1/nodes/n1/proxy/stats/summary", None);
        assert_eq!(
            (verb.as_str(), r.resource.as_str(), r.name.as_str(), r.subresource.as_str()),
            ("get", "nodes", "n1", "proxy")
        );
        let (verb, r) = res(Method::POST, "/api/v1/namespaces/ns/pods/p/exec", Some("command=sh"));
        assert_eq!((verb.as_str(), r.subresource.as_str()), ("create", "exec"));
        for path in ["/api", "/api/v1", "/apis/apps", "/apis/apps/v1", "/healthz", "/metrics"] {
            assert_eq!(Attributes::of(&Method::GET, path, None).resource, None, "{path}");
        }
    }

    #[test]
    fn forbidden_text_is_upstreams() {
        let user = User::new("system:node:a", vec![]);
        let a = Attributes::of(&Method::GET, "/api/v1/namespaces/default/secrets/s", None);
        assert_eq!(
            a.forbidden_message(&user),
            r#"User "system:node:a" cannot get resource "secrets" in API group "" in the namespace "default""#
        );
        let a = Attributes::of(&Method::GET, "/api/v1/nodes", None);
        assert_eq!(
            a.forbidden_message(&user),
            r#"User "system:node:a" cannot list resource "nodes" in API group "" at the cluster scope"#
        );
        let a = Attributes::of(&Method::GET, "/metrics", None);
        assert_eq!(a.forbidden_message(&user), r#"User "system:node:a" cannot get path "/metrics""#);
    }
}
