//! What a joined node last knew of its pods, kept on its own disk so that it can start them again
//! while the server cannot be reached (KubeEdge's edge autonomy): its Node, its pods, and the
//! objects each pod refers to (ConfigMaps, Secrets, claims, volumes, Services for its environment).
//!
//! One file per entry under `<data-dir>/agent/local-store/`, each sealed with ChaCha20-Poly1305
//! under a key of its own (`<data-dir>/agent/local-store.key`, 0600), so Secrets are never on disk
//! in the clear. An entry is written only when what it holds changed (a hash of each is kept), so an
//! idle node writes nothing.

use std::collections::HashMap;
use std::hash::{Hash as _, Hasher as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context as _, Result, anyhow};
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::rand::{SecureRandom as _, SystemRandom};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub struct LocalStore {
    dir: PathBuf,
    key: LessSafeKey,
    random: SystemRandom,
    /// The hash of what each entry holds on disk, as this process wrote or read it.
    written: Mutex<HashMap<String, u64>>,
}

fn digest(bytes: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

impl LocalStore {
    /// Opens the store in `dir`, with the key in `key_file` (made on first use).
    pub fn open(dir: &Path, key_file: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let random = SystemRandom::new();
        let key = match std::fs::read(key_file) {
            Ok(k) => k,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut k = vec![0u8; aead::CHACHA20_POLY1305.key_len()];
                random.fill(&mut k).map_err(|_| anyhow!("no randomness for the local store's key"))?;
                crate::api::pki::write_atomic(key_file, 0o600, &k)?;
                k
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", key_file.display())),
        };
        let key = UnboundKey::new(&aead::CHACHA20_POLY1305, &key)
            .map_err(|_| anyhow!("{} is not a local store key", key_file.display()))?;
        Ok(LocalStore { dir: dir.to_path_buf(), key: LessSafeKey::new(key), random, written: Mutex::default() })
    }

    fn written(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.written.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Keeps `value` as entry `name`, unless it already holds just that.
    pub fn put<T: Serialize>(&self, name: &str, value: &T) {
        let Ok(plain) = serde_json::to_vec(value) else { return };
        let hash = digest(&plain);
        if self.written().get(name) == Some(&hash) {
            return;
        }
        match self.seal(plain).and_then(|sealed| Ok(crate::api::pki::write_atomic(&self.path(name), 0o600, &sealed)?)) {
            Ok(()) => {
                self.written().insert(name.to_string(), hash);
            }
            Err(e) => tracing::warn!("node agent: keeping {name} in the local store: {e:#}"),
        }
    }

    /// Entry `name`, if it is there and opens with the key.
    pub fn get<T: DeserializeOwned>(&self, name: &str) -> Option<T> {
        let sealed = std::fs::read(self.path(name)).ok()?;
        let plain = match self.open_sealed(sealed) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("node agent: the local store's {name} cannot be read: {e:#}");
                return None;
            }
        };
        let value = serde_json::from_slice(&plain).ok()?;
        self.written().insert(name.to_string(), digest(&plain));
        Some(value)
    }

    pub fn has(&self, name: &str) -> bool {
        self.path(name).exists()
    }

    pub fn remove(&self, name: &str) {
        if self.written().remove(name).is_some() || self.path(name).exists() {
            let _ = std::fs::remove_file(self.path(name));
        }
    }

    /// The names of the entries on disk.
    pub fn names(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        entries.flatten().filter_map(|e| e.file_name().into_string().ok()).filter(|n| !n.starts_with('.')).collect()
    }

    /// A random nonce, then the ciphertext and its tag.
    fn seal(&self, mut data: Vec<u8>) -> Result<Vec<u8>> {
        let mut nonce = [0u8; aead::NONCE_LEN];
        self.random.fill(&mut nonce).map_err(|_| anyhow!("no randomness for a nonce"))?;
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut data)
            .map_err(|_| anyhow!("sealing failed"))?;
        let mut out = nonce.to_vec();
        out.extend(data);
        Ok(out)
    }

    fn open_sealed(&self, sealed: Vec<u8>) -> Result<Vec<u8>> {
        if sealed.len() < aead::NONCE_LEN {
            anyhow::bail!("too short");
        }
        let (nonce, rest) = sealed.split_at(aead::NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| anyhow!("bad nonce"))?;
        let mut data = rest.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::empty(), &mut data)
            .map_err(|_| anyhow!("not sealed with this node's key"))?;
        Ok(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_sealed_kept_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let (data, key) = (dir.path().join("store"), dir.path().join("key"));
        let store = LocalStore::open(&data, &key).unwrap();
        store.put("secret", &serde_json::json!({"password": "hunter2"}));
        let on_disk = std::fs::read(data.join("secret")).unwrap();
        assert!(!String::from_utf8_lossy(&on_disk).contains("hunter2"), "sealed at rest");
        // The same value again is not written again.
        std::fs::remove_file(data.join("secret")).unwrap();
        store.put("secret", &serde_json::json!({"password": "hunter2"}));
        assert!(!data.join("secret").exists(), "an unchanged entry is not rewritten");
        store.put("secret", &serde_json::json!({"password": "hunter3"}));
        assert!(data.join("secret").exists());

        let again = LocalStore::open(&data, &key).unwrap();
        let read: serde_json::Value = again.get("secret").unwrap();
        assert_eq!(read["password"], "hunter3");
        assert_eq!(again.names(), ["secret"]);

        let other = LocalStore::open(&data, &dir.path().join("other-key")).unwrap();
        assert!(other.get::<serde_json::Value>("secret").is_none(), "another key opens nothing");
        again.remove("secret");
        assert!(again.names().is_empty());
    }
}
