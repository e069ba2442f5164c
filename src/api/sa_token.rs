//! Service account tokens (upstream's `pkg/serviceaccount`): JWTs signed with the cluster's service
//! account key, issued through the TokenRequest subresource, checked on every request that presents
//! one (signature, issuer, audience, lifetime, and the objects it names still being there), and the
//! OIDC discovery documents (`/.well-known/openid-configuration`, `/openid/v1/jwks`) other systems
//! verify them with.
//!
//! Legacy tokens, kept in Secrets of type `kubernetes.io/service-account-token` (issuer
//! `kubernetes/serviceaccount`, no expiry), are signed with the same key and valid while their Secret
//! holds them and their service account exists.
//!
//! The key is `<data-dir>/server/tls/service.key` (k3s's name), ECDSA P-256 signing ES256: ring, which
//! cairn's TLS and certificates use, cannot generate RSA keys. Tokens themselves are never logged.

use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use k8s_openapi::jiff::Timestamp;
use rcgen::{KeyPair, PublicKeyData as _};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use super::User;
use super::pki::{self, Error};
use crate::registry::token_request::{Bound, TokenGrant, TokenPolicy};
use crate::registry::{Registry, StatusError};

pub const KEY_FILE: &str = "service.key";
/// kube-apiserver's `--service-account-issuer` as k3s sets it.
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// The issuer of the tokens kept in Secrets (upstream's `LegacyIssuer`).
pub const LEGACY_ISSUER: &str = "kubernetes/serviceaccount";
/// How long a verified token is taken as valid without checking again (upstream's token success
/// cache TTL).
const CACHE_TTL: Duration = Duration::from_secs(10);
const CACHE_ENTRIES: usize = 1024;
/// Clock skew tolerated on `nbf` and `exp` (go-jose's `DefaultLeeway`).
const LEEWAY_SECONDS: u64 = 60;
/// A token bound to a pod stays valid this long after the pod's deletion time (upstream's grace).
const DELETED_POD_GRACE_SECONDS: i64 = 60;

/// A service account, or an object a token is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ref {
    pub name: String,
    pub uid: String,
}

impl From<&Bound> for Ref {
    fn from(b: &Bound) -> Self {
        Ref { name: b.name.clone(), uid: b.uid.clone() }
    }
}

/// The claims upstream puts under `kubernetes.io`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Private {
    pub namespace: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<Ref>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<Ref>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<Ref>,
    pub serviceaccount: Ref,
    /// After this time a client still presenting the token is using one the kubelet replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warnafter: Option<i64>,
}

/// A token's claims, in upstream's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub aud: Vec<String>,
    pub exp: i64,
    pub iat: i64,
    pub iss: String,
    pub jti: String,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: Private,
    pub nbf: i64,
    pub sub: String,
}

/// The claims of a token kept in a Secret (upstream's `legacyPrivateClaims`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LegacyClaims {
    pub iss: String,
    #[serde(rename = "kubernetes.io/serviceaccount/namespace")]
    pub namespace: String,
    #[serde(rename = "kubernetes.io/serviceaccount/secret.name")]
    pub secret: String,
    #[serde(rename = "kubernetes.io/serviceaccount/service-account.name")]
    pub service_account: String,
    #[serde(rename = "kubernetes.io/serviceaccount/service-account.uid")]
    pub service_account_uid: String,
    pub sub: String,
}

/// Why a token is not accepted. Only for the server's debug log: the client hears 401.
#[derive(Debug, thiserror::Error)]
pub enum Rejected {
    #[error("the token is not one this cluster issued: {0}")]
    Invalid(String),
    #[error("service account token has been invalidated: {0}")]
    Invalidated(String),
}

/// The issuer: signs, verifies and describes service account tokens.
pub struct ServiceAccountTokens {
    encoding: EncodingKey,
    decoding: DecodingKey,
    key_id: String,
    /// The public key's coordinates, base64url.
    x: String,
    y: String,
    issuer: String,
    policy: TokenPolicy,
    validation: Validation,
    legacy_validation: Validation,
    cache: Mutex<lru::LruCache<[u8; 32], (User, Instant)>>,
}

impl ServiceAccountTokens {
    /// Loads the key in `dir`, or makes one. `policy.audiences` are the API's own audiences
    /// (`--api-audiences`; the issuer when empty).
    pub fn load_or_create(dir: &Path, issuer: &str, mut policy: TokenPolicy) -> Result<Self, Error> {
        let path = dir.join(KEY_FILE);
        let key =
            match std::fs::read_to_string(&path) {
                Ok(pem) => KeyPair::from_pem(&pem)
                    .map_err(|e| Error::Unusable { path: path.clone(), reason: format!("not a private key: {e}") })?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|cause| {
                        Error::Generate { what: "the service account key", path: path.clone(), cause }
                    })?;
                    std::fs::create_dir_all(dir).map_err(|cause| Error::Io {
                        step: "creating",
                        path: dir.into(),
                        cause,
                    })?;
                    pki::write_atomic(&path, 0o600, key.serialize_pem().as_bytes())?;
                    tracing::info!("made a new service account key {}", path.display());
                    key
                }
                Err(cause) => return Err(Error::Io { step: "reading", path, cause }),
            };
        if key.algorithm() != &rcgen::PKCS_ECDSA_P256_SHA256 {
            return Err(Error::Unusable { path, reason: "the service account key must be an ECDSA P-256 key".into() });
        }
        // An uncompressed point: 0x04, then x and y.
        let point = key.public_key_raw();
        let (x, y) = point.get(1..).unwrap_or_default().split_at(point.len().saturating_sub(1) / 2);
        let (x, y) = (B64URL.encode(x), B64URL.encode(y));
        let decoding = DecodingKey::from_ec_components(&x, &y)
            .map_err(|e| Error::Unusable { path: path.clone(), reason: format!("its public key is unusable: {e}") })?;
        if policy.audiences.is_empty() {
            policy.audiences = vec![issuer.to_string()];
        }
        let mut validation = Validation::new(Algorithm::ES256);
        validation.set_issuer(&[issuer]);
        validation.set_audience(&policy.audiences);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.validate_nbf = true;
        validation.leeway = LEEWAY_SECONDS;
        let mut legacy_validation = Validation::new(Algorithm::ES256);
        legacy_validation.set_issuer(&[LEGACY_ISSUER]);
        legacy_validation.set_required_spec_claims(&["iss", "sub"]);
        legacy_validation.validate_exp = false;
        legacy_validation.validate_aud = false;
        Ok(ServiceAccountTokens {
            encoding: EncodingKey::from_ec_der(key.serialized_der()),
            decoding,
            // Upstream's `keyIDFromPublicKey`: the unpadded base64url SHA-256 of the DER public key.
            key_id: B64URL.encode(Sha256::digest(key.subject_public_key_info())),
            x,
            y,
            issuer: issuer.to_string(),
            policy,
            validation,
            legacy_validation,
            cache: Mutex::new(lru::LruCache::new(NonZeroUsize::new(CACHE_ENTRIES).unwrap_or(NonZeroUsize::MIN))),
        })
    }

    /// What TokenRequests are checked against.
    pub fn policy(&self) -> &TokenPolicy {
        &self.policy
    }

    /// A signed token for `grant`, and when it expires.
    pub fn issue(&self, grant: &TokenGrant) -> Result<(String, Timestamp), StatusError> {
        let now = Timestamp::now().as_second();
        let claims = Claims {
            aud: grant.audiences.clone(),
            exp: now + grant.lifetime_seconds,
            iat: now,
            iss: self.issuer.clone(),
            jti: uuid::Uuid::new_v4().to_string(),
            kubernetes: Private {
                namespace: grant.namespace.clone(),
                node: grant.node.as_ref().map(Ref::from),
                pod: grant.pod.as_ref().map(Ref::from),
                secret: grant.secret.as_ref().map(Ref::from),
                serviceaccount: Ref::from(&grant.service_account),
                warnafter: grant.warn_after_seconds.map(|s| now + s),
            },
            nbf: now,
            sub: format!("system:serviceaccount:{}:{}", grant.namespace, grant.service_account.name),
        };
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.key_id.clone());
        let token = jsonwebtoken::encode(&header, &claims, &self.encoding)
            .map_err(|e| StatusError::internal(format!("signing the service account token: {e}")))?;
        let expires = Timestamp::from_second(claims.exp).unwrap_or(Timestamp::MAX);
        Ok((token, expires))
    }

    /// A token to keep in Secret `secret` for `account` of `namespace` (the tokens controller's).
    pub fn issue_legacy(&self, namespace: &str, account: &Ref, secret: &str) -> Result<String, String> {
        let claims = LegacyClaims {
            iss: LEGACY_ISSUER.into(),
            namespace: namespace.into(),
            secret: secret.into(),
            service_account: account.name.clone(),
            service_account_uid: account.uid.clone(),
            sub: format!("system:serviceaccount:{namespace}:{}", account.name),
        };
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.key_id.clone());
        jsonwebtoken::encode(&header, &claims, &self.encoding).map_err(|e| format!("signing the token: {e}"))
    }

    /// The claims of a token this cluster signed and that has not expired.
    pub fn verify(&self, token: &str) -> Result<Claims, Rejected> {
        self.decode(token, &self.validation)
    }

    fn decode<T: serde::de::DeserializeOwned>(&self, token: &str, validation: &Validation) -> Result<T, Rejected> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| Rejected::Invalid(e.to_string()))?;
        if header.kid.as_deref().is_some_and(|kid| kid != self.key_id) {
            return Err(Rejected::Invalid("signed with another key".into()));
        }
        let data = jsonwebtoken::decode::<T>(token, &self.decoding, validation)
            .map_err(|e| Rejected::Invalid(e.to_string()))?;
        Ok(data.claims)
    }

    /// The user a token stands for (upstream's service account token authenticator): valid, and
    /// its service account and the object it is bound to still there with the same UIDs. Answers
    /// are kept for [`CACHE_TTL`].
    pub fn authenticate(&self, registry: &Registry, token: &str) -> Result<User, Rejected> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            match cache.get(&digest) {
                Some((user, at)) if at.elapsed() < CACHE_TTL => return Ok(user.clone()),
                Some(_) => drop(cache.pop(&digest)),
                None => {}
            }
        }
        let user = if unverified_issuer(token).as_deref() == Some(LEGACY_ISSUER) {
            let claims: LegacyClaims = self.decode(token, &self.legacy_validation)?;
            legacy_user_of(registry, &claims, token)?
        } else {
            user_of(registry, &self.verify(token)?)?
        };
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).put(digest, (user.clone(), Instant::now()));
        Ok(user)
    }

    /// `/.well-known/openid-configuration`, pointing at the JWKS served at `jwks_uri`.
    pub fn discovery(&self, jwks_uri: &str) -> Value {
        json!({
            "issuer": self.issuer,
            "jwks_uri": jwks_uri,
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
        })
    }

    /// `/openid/v1/jwks`: the public key.
    pub fn jwks(&self) -> Value {
        json!({"keys": [{
            "use": "sig", "kty": "EC", "kid": self.key_id, "crv": "P-256", "alg": "ES256", "x": self.x, "y": self.y,
        }]})
    }
}

/// The user of valid `claims`, once the objects they name are checked.
fn user_of(registry: &Registry, claims: &Claims) -> Result<User, Rejected> {
    let k = &claims.kubernetes;
    let ns = k.namespace.as_str();
    let gone = |what: &str, r: &Ref| Rejected::Invalidated(format!("{what} {ns}/{} is gone or was replaced", r.name));
    let object = |plural: &str, namespaced: bool, r: &Ref| -> Option<Value> {
        let resource = registry.find("", "v1", plural)?;
        let obj = registry.get_value(&resource, namespaced.then_some(ns), &r.name).ok()?;
        (obj["metadata"]["uid"] == r.uid.as_str()).then_some(obj)
    };
    object("serviceaccounts", true, &k.serviceaccount).ok_or_else(|| gone("service account", &k.serviceaccount))?;
    if let Some(pod_ref) = &k.pod {
        let pod = object("pods", true, pod_ref).ok_or_else(|| gone("pod", pod_ref))?;
        let deleted = pod["metadata"]["deletionTimestamp"].as_str().and_then(|t| t.parse::<Timestamp>().ok());
        if deleted.is_some_and(|t| t.as_second() + DELETED_POD_GRACE_SECONDS < Timestamp::now().as_second()) {
            return Err(gone("pod", pod_ref));
        }
    }
    if let Some(secret) = &k.secret {
        object("secrets", true, secret).ok_or_else(|| gone("secret", secret))?;
    }
    // A token naming the node of its pod stays valid if the Node goes; one bound to a Node does not.
    if let (Some(node), None) = (&k.node, &k.pod) {
        object("nodes", false, node).ok_or_else(|| gone("node", node))?;
    }
    let mut user =
        User::new(claims.sub.clone(), vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{ns}")]);
    user.uid = k.serviceaccount.uid.clone();
    let mut extra = |key: &str, value: &str| {
        user.extra.insert(format!("authentication.kubernetes.io/{key}"), vec![value.to_string()]);
    };
    if let Some(pod) = &k.pod {
        extra("pod-name", &pod.name);
        extra("pod-uid", &pod.uid);
    }
    if let Some(node) = &k.node {
        extra("node-name", &node.name);
        extra("node-uid", &node.uid);
    }
    extra("credential-id", &format!("JTI={}", claims.jti));
    Ok(user)
}

/// The `iss` a token claims, read before its signature is checked: only to choose how to check it.
fn unverified_issuer(token: &str) -> Option<String> {
    let payload = B64URL.decode(token.split('.').nth(1)?).ok()?;
    serde_json::from_slice::<Value>(&payload).ok()?["iss"].as_str().map(str::to_string)
}

/// The user of a token kept in a Secret (upstream's legacy validator): its Secret still holds it
/// and is not being deleted, and its service account is the one it names.
fn legacy_user_of(registry: &Registry, claims: &LegacyClaims, token: &str) -> Result<User, Rejected> {
    use base64::engine::general_purpose::STANDARD;
    let ns = claims.namespace.as_str();
    let get = |plural: &str, name: &str| {
        registry.find("", "v1", plural).and_then(|r| registry.get_value(&r, Some(ns), name).ok())
    };
    let invalidated = |what: String| Rejected::Invalidated(what);
    let sa = get("serviceaccounts", &claims.service_account)
        .filter(|sa| sa["metadata"]["uid"] == claims.service_account_uid.as_str())
        .ok_or_else(|| {
            invalidated(format!("service account {ns}/{} is gone or was replaced", claims.service_account))
        })?;
    let secret =
        get("secrets", &claims.secret).ok_or_else(|| invalidated(format!("secret {ns}/{} is gone", claims.secret)))?;
    let kept = secret["data"]["token"].as_str().and_then(|t| STANDARD.decode(t).ok()).unwrap_or_default();
    if kept != token.as_bytes() || !secret["metadata"]["deletionTimestamp"].is_null() {
        return Err(invalidated(format!("secret {ns}/{} no longer holds the token", claims.secret)));
    }
    let mut user =
        User::new(claims.sub.clone(), vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{ns}")]);
    user.uid = sa["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    Ok(user)
}

/// Whether a bearer token has a JWT's shape (three base64url parts), so it is worth verifying.
pub fn looks_like_jwt(token: &str) -> bool {
    token.split('.').count() == 3 && token.starts_with("eyJ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(lifetime: i64) -> TokenGrant {
        TokenGrant {
            namespace: "team".into(),
            service_account: Bound { name: "reader".into(), uid: "sa-uid".into() },
            audiences: vec![DEFAULT_ISSUER.into()],
            lifetime_seconds: lifetime,
            warn_after_seconds: None,
            pod: Some(Bound { name: "p".into(), uid: "pod-uid".into() }),
            secret: None,
            node: Some(Bound { name: "n".into(), uid: "node-uid".into() }),
        }
    }

    #[test]
    fn tokens_carry_upstreams_claims_and_verify_only_with_this_key() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = ServiceAccountTokens::load_or_create(dir.path(), DEFAULT_ISSUER, TokenPolicy::default()).unwrap();
        let (token, expires) = tokens.issue(&grant(600)).unwrap();
        assert!(looks_like_jwt(&token));
        let claims = tokens.verify(&token).unwrap();
        assert_eq!(claims.sub, "system:serviceaccount:team:reader");
        assert_eq!(claims.aud, [DEFAULT_ISSUER]);
        assert_eq!(claims.exp, expires.as_second());
        assert_eq!(claims.exp - claims.iat, 600);
        assert_eq!(claims.kubernetes.pod, Some(Ref { name: "p".into(), uid: "pod-uid".into() }));
        let header = jsonwebtoken::decode_header(&token).unwrap();
        assert_eq!((header.alg, header.kid.as_deref()), (Algorithm::ES256, Some(tokens.key_id.as_str())));

        // The same key after a restart; a new key in another directory does not accept it.
        let again = ServiceAccountTokens::load_or_create(dir.path(), DEFAULT_ISSUER, TokenPolicy::default()).unwrap();
        assert!(again.verify(&token).is_ok());
        let other_dir = tempfile::tempdir().unwrap();
        let other =
            ServiceAccountTokens::load_or_create(other_dir.path(), DEFAULT_ISSUER, TokenPolicy::default()).unwrap();
        assert!(matches!(other.verify(&token), Err(Rejected::Invalid(_))));
        // Another audience, another issuer, an expired token, a forged signature.
        let narrow = TokenPolicy { audiences: vec!["vault".into()], ..Default::default() };
        let vault = ServiceAccountTokens::load_or_create(dir.path(), DEFAULT_ISSUER, narrow).unwrap();
        assert!(vault.verify(&token).is_err(), "a token for the API is not one for vault");
        let elsewhere = ServiceAccountTokens::load_or_create(dir.path(), "https://elsewhere", TokenPolicy::default());
        assert!(elsewhere.unwrap().verify(&token).is_err());
        let (old, _) = tokens.issue(&grant(-120)).unwrap();
        assert!(tokens.verify(&old).is_err(), "expired beyond the leeway");
        let mut forged: Vec<&str> = token.split('.').collect();
        let body =
            B64URL.encode(serde_json::to_vec(&json!({"sub": "system:serviceaccount:kube-system:admin"})).unwrap());
        forged[1] = &body;
        assert!(tokens.verify(&forged.join(".")).is_err());
    }

    #[test]
    fn legacy_tokens_have_no_expiry_and_are_checked_as_legacy() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = ServiceAccountTokens::load_or_create(dir.path(), DEFAULT_ISSUER, TokenPolicy::default()).unwrap();
        let account = Ref { name: "builder".into(), uid: "u".into() };
        let token = tokens.issue_legacy("apps", &account, "builder-token").unwrap();
        assert_eq!(unverified_issuer(&token).as_deref(), Some(LEGACY_ISSUER));
        let claims: LegacyClaims = tokens.decode(&token, &tokens.legacy_validation).unwrap();
        assert_eq!(claims.sub, "system:serviceaccount:apps:builder");
        assert_eq!(claims.secret, "builder-token");
        assert!(tokens.verify(&token).is_err(), "not a bound token: no audience, no expiry");
        let other = tempfile::tempdir().unwrap();
        let other = ServiceAccountTokens::load_or_create(other.path(), DEFAULT_ISSUER, TokenPolicy::default()).unwrap();
        assert!(other.decode::<LegacyClaims>(&token, &other.legacy_validation).is_err());
    }

    #[test]
    fn the_jwks_holds_the_key_that_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = ServiceAccountTokens::load_or_create(dir.path(), DEFAULT_ISSUER, TokenPolicy::default()).unwrap();
        let (token, _) = tokens.issue(&grant(600)).unwrap();
        let jwks: jsonwebtoken::jwk::JwkSet = serde_json::from_value(tokens.jwks()).unwrap();
        let key = DecodingKey::from_jwk(&jwks.keys[0]).unwrap();
        let mut validation = Validation::new(Algorithm::ES256);
        validation.set_audience(&[DEFAULT_ISSUER]);
        assert!(jsonwebtoken::decode::<Claims>(&token, &key, &validation).is_ok());
        let discovery = tokens.discovery("https://127.0.0.1:6443/openid/v1/jwks");
        assert_eq!(discovery["issuer"], DEFAULT_ISSUER);
        assert_eq!(discovery["id_token_signing_alg_values_supported"], json!(["ES256"]));
    }
}
