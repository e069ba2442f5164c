//! Service account tokens for pods' projected volumes (kubelet's token manager): one per pod,
//! audience and lifetime, requested bound to the pod and reused until 80 % of its life, or 24
//! hours, has passed. A token that cannot be renewed is kept while it is valid.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;

use super::cluster::{IssuedToken, PodApi};
use super::spec;
use crate::volumes::{TokenKey, token_keys};

/// kubelet's `maxTTL`: no token is used longer than this without asking for a fresh one.
const MAX_AGE_SECONDS: i64 = 24 * 3600;

/// The tokens held for the node's pods.
#[derive(Default)]
pub struct Tokens {
    held: Mutex<HashMap<(String, TokenKey), IssuedToken>>,
}

/// Whether `token` should be replaced at `now` (unix seconds).
fn stale(token: &IssuedToken, now: i64) -> bool {
    let life = token.expires - token.issued;
    now >= token.issued + (life * 8 / 10).min(MAX_AGE_SECONDS)
}

impl Tokens {
    /// The tokens `pod`'s volumes ask for, fresh enough; the error is the first that left one
    /// without any valid token.
    pub async fn for_pod(&self, api: &dyn PodApi, pod: &Pod) -> Result<BTreeMap<TokenKey, String>, String> {
        let uid = spec::uid(pod).to_string();
        let mut out = BTreeMap::new();
        for key in token_keys(pod) {
            let now = k8s_openapi::jiff::Timestamp::now().as_second();
            let held = self.lock().get(&(uid.clone(), key.clone())).cloned();
            let token = match held {
                Some(t) if !stale(&t, now) => t,
                held => match api.token(pod, &key).await {
                    Ok(fresh) => {
                        self.lock().insert((uid.clone(), key.clone()), fresh.clone());
                        fresh
                    }
                    Err(e) => match held.filter(|t| t.expires > now) {
                        Some(t) => {
                            tracing::debug!("pod {uid}: keeping its service account token, a new one failed: {e}");
                            t
                        }
                        None => return Err(format!("failed to fetch token: {e}")),
                    },
                },
            };
            out.insert(key, token.token);
        }
        Ok(out)
    }

    /// Forgets the tokens of a pod that is gone.
    pub fn forget(&self, uid: &str) {
        self.lock().retain(|(pod, _), _| pod != uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, TokenKey), IssuedToken>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::fake::{FakeApi, Written};

    fn pod(uid: &str, sources: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": uid},
            "spec": {"containers": [{"name": "c"}], "volumes": [{"name": "v", "projected": {"sources": sources}}]},
        }))
        .unwrap()
    }

    #[test]
    fn a_token_is_renewed_at_eighty_percent_of_its_life_or_after_a_day() {
        let t = |issued, expires| IssuedToken { token: String::new(), issued, expires };
        assert!(!stale(&t(0, 3600), 2879));
        assert!(stale(&t(0, 3600), 2880));
        let year = 365 * 24 * 3600;
        assert!(!stale(&t(0, year), MAX_AGE_SECONDS - 1));
        assert!(stale(&t(0, year), MAX_AGE_SECONDS));
    }

    #[tokio::test]
    async fn one_token_per_audience_and_lifetime_reused_while_fresh() {
        let api = FakeApi::default();
        let tokens = Tokens::default();
        let p = pod(
            "u1",
            serde_json::json!([
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"serviceAccountToken": {"path": "again", "expirationSeconds": 3607}},
                {"serviceAccountToken": {"path": "vault", "audience": "vault"}},
            ]),
        );
        let got = tokens.for_pod(&api, &p).await.unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[&TokenKey { audience: "vault".into(), expiration_seconds: 3600 }], "token-of-u1-for-vault-3600");
        tokens.for_pod(&api, &p).await.unwrap();
        let asked = api.written().iter().filter(|w| matches!(w, Written::Token(uid) if uid == "u1")).count();
        assert_eq!(asked, 2, "fresh tokens are reused");
        tokens.forget("u1");
        tokens.for_pod(&api, &p).await.unwrap();
        assert_eq!(api.written().iter().filter(|w| matches!(w, Written::Token(_))).count(), 4);
        assert!(tokens.for_pod(&api, &pod("u2", serde_json::json!([]))).await.unwrap().is_empty());
    }
}
