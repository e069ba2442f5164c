//! The keys every server of one datastore shares, as k3s's bootstrap data: the cluster CA
//! (certificate and key) and the service account signing key. The first server puts them in the
//! datastore sealed with a key derived from the join token's secret (PBKDF2-HMAC-SHA256 over a
//! random salt, then ChaCha20-Poly1305); a server started later with the same token takes them, so
//! every server issues certificates from the same CA and accepts the same tokens, and the keys are
//! useless to whoever reads the datastore without the token.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::path::Path;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::rand::{SecureRandom as _, SystemRandom};

use super::pki;

/// Where the sealed keys are kept in the datastore (k3s keeps its own under `/bootstrap/`).
pub const DATASTORE_KEY: &str = "/bootstrap/cairn";
/// The files shared, in the server's TLS directory.
const FILES: [&str; 3] = [pki::CA_CERT, pki::CA_KEY, super::sa_token::KEY_FILE];
const SALT_LEN: usize = 16;
/// PBKDF2 rounds: a guessed token costs this much; a start pays it once.
const ROUNDS: NonZeroU32 = NonZeroU32::new(100_000).unwrap();

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("writing {path}: {source}")]
    Write { path: String, source: pki::Error },
    #[error(
        "the datastore already holds another cluster's keys, sealed with another token: start this server with \
         --token set to the first server's token (its <data-dir>/server/token)"
    )]
    WrongToken,
    #[error("the shared keys in the datastore are unreadable: {0}")]
    Corrupt(String),
    #[error("the system's random number generator failed")]
    Random,
}

/// The shared files of `dir`, sealed with `secret`.
pub fn seal(dir: &Path, secret: &str) -> Result<Vec<u8>, Error> {
    let mut files = BTreeMap::new();
    for name in FILES {
        let path = dir.join(name);
        let text = std::fs::read_to_string(&path)
            .map_err(|source| Error::Read { path: path.display().to_string(), source })?;
        files.insert(name.to_string(), text);
    }
    let mut plain = serde_json::to_vec(&files).map_err(|e| Error::Corrupt(e.to_string()))?;
    let rng = SystemRandom::new();
    let mut salt = [0u8; SALT_LEN];
    let mut nonce = [0u8; aead::NONCE_LEN];
    rng.fill(&mut salt).map_err(|_| Error::Random)?;
    rng.fill(&mut nonce).map_err(|_| Error::Random)?;
    key(secret, &salt)?
        .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut plain)
        .map_err(|_| Error::Random)?;
    Ok([salt.as_slice(), nonce.as_slice(), plain.as_slice()].concat())
}

/// Opens what [`seal`] made and writes the files into `dir` where they differ. Returns whether
/// anything changed (the certificates issued from an old CA are then issued again on loading).
pub fn install(dir: &Path, sealed: &[u8], secret: &str) -> Result<bool, Error> {
    if sealed.len() < SALT_LEN + aead::NONCE_LEN + aead::CHACHA20_POLY1305.tag_len() {
        return Err(Error::Corrupt("too short".into()));
    }
    let (salt, rest) = sealed.split_at(SALT_LEN);
    let (nonce, sealed) = rest.split_at(aead::NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| Error::Corrupt("bad nonce".into()))?;
    let mut buffer = sealed.to_vec();
    let plain = key(secret, salt)?.open_in_place(nonce, Aad::empty(), &mut buffer).map_err(|_| Error::WrongToken)?;
    let files: BTreeMap<String, String> = serde_json::from_slice(plain).map_err(|e| Error::Corrupt(e.to_string()))?;
    pki::create_private_dir(dir).map_err(|source| Error::Write { path: dir.display().to_string(), source })?;
    let mut changed = false;
    for name in FILES {
        let text = files.get(name).ok_or_else(|| Error::Corrupt(format!("{name} is missing")))?;
        let path = dir.join(name);
        if std::fs::read_to_string(&path).ok().as_ref() == Some(text) {
            continue;
        }
        let mode = if name.ends_with(".key") { 0o600 } else { 0o644 };
        pki::write_atomic(&path, mode, text.as_bytes())
            .map_err(|source| Error::Write { path: path.display().to_string(), source })?;
        changed = true;
    }
    Ok(changed)
}

fn key(secret: &str, salt: &[u8]) -> Result<LessSafeKey, Error> {
    let mut key = [0u8; 32];
    ring::pbkdf2::derive(ring::pbkdf2::PBKDF2_HMAC_SHA256, ROUNDS, salt, secret.as_bytes(), &mut key);
    UnboundKey::new(&aead::CHACHA20_POLY1305, &key).map(LessSafeKey::new).map_err(|_| Error::Random)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path, tag: &str) {
        for name in FILES {
            std::fs::write(dir.join(name), format!("{tag} {name}")).unwrap();
        }
    }

    #[test]
    fn sealed_keys_open_only_with_their_token() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        files(a.path(), "first");
        let sealed = seal(a.path(), "secret-a").unwrap();
        assert!(!String::from_utf8_lossy(&sealed).contains("first"), "the keys are not in the clear");
        assert!(matches!(install(b.path(), &sealed, "secret-b"), Err(Error::WrongToken)));
        assert!(!b.path().join(pki::CA_KEY).exists());

        files(b.path(), "second");
        assert!(install(b.path(), &sealed, "secret-a").unwrap());
        for name in FILES {
            assert_eq!(std::fs::read_to_string(b.path().join(name)).unwrap(), format!("first {name}"));
        }
        assert!(!install(b.path(), &sealed, "secret-a").unwrap(), "nothing to change the second time");
        let mut tampered = sealed.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert!(install(b.path(), &tampered, "secret-a").is_err());
        assert!(matches!(install(b.path(), &sealed[..10], "secret-a"), Err(Error::Corrupt(_))));
    }
}
