//! Certificates and credentials for the API server and the node endpoint.
//!
//! [`Pki`] owns a directory holding a self-signed cluster CA, the serving
//! certificate of the API server, the `system:admin` client certificate, and
//! the node endpoint's pair (k3s's `serving-kubelet.crt`, and the client
//! certificate the API server calls it with, kubeadm's
//! `apiserver-kubelet-client.crt`). It
//! creates what is missing, re-issues leaf certificates that are close to expiry,
//! corrupt, not issued by the CA or (serving certificate) missing a wanted
//! subject alternative name, and hot-swaps the serving certificate of running
//! TLS listeners through [`SwappableCert`].

use std::fmt;
use std::fs::{self, DirBuilder, OpenOptions, Permissions};
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, string::Ia5String,
};
use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use time::OffsetDateTime;
use tracing::{info, warn};
use x509_parser::extensions::GeneralName;

/// How long the CA is valid.
const CA_VALIDITY: time::Duration = time::Duration::days(3650);
/// How long leaf certificates are valid.
const LEAF_VALIDITY: time::Duration = time::Duration::days(365);
/// Leaf certificates expiring within this window are re-issued.
const RENEW_BEFORE: time::Duration = time::Duration::days(90);
/// Certificates start being valid slightly in the past to tolerate clock skew.
const BACKDATE: time::Duration = time::Duration::hours(1);

/// How often a long-running server should call [`Pki::renew_if_needed`].
pub const RENEWAL_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

pub(super) const CA_CERT: &str = "server-ca.crt";
pub(super) const CA_KEY: &str = "server-ca.key";
const ADMIN_USER: &str = "system:admin";
const ADMIN_GROUP: &str = "system:masters";
/// The group of every node's identity (`system:node:<name>`).
pub const NODES_GROUP: &str = "system:nodes";
/// The identity the API server calls node endpoints as (kubeadm's); the only one they serve.
pub const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";

/// Errors raised while loading, issuing or writing TLS material.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file system step failed on `path`.
    #[error("{step} {}: {cause}", path.display())]
    Io { step: &'static str, path: PathBuf, cause: io::Error },
    /// An existing file cannot be used; the CA is never replaced silently.
    #[error("{} is unusable: {reason}", path.display())]
    Unusable { path: PathBuf, reason: String },
    /// Key or certificate generation failed.
    #[error("generating {what} for {}: {cause}", path.display())]
    Generate { what: &'static str, path: PathBuf, cause: rcgen::Error },
    /// A `--tls-san` entry is neither an IP address nor a DNS name.
    #[error("invalid TLS SAN {0:?}: neither an IP address nor a DNS name")]
    InvalidSan(String),
    /// rustls rejected the TLS configuration or serving key.
    #[error("{step}: {cause}")]
    Tls { step: &'static str, cause: rustls::Error },
    /// The client certificate verifier could not be built.
    #[error("building the client certificate verifier for {}: {cause}", path.display())]
    Verifier { path: PathBuf, cause: rustls::server::VerifierBuilderError },
    /// The kubeconfig could not be serialized.
    #[error("rendering kubeconfig {}: {cause}", path.display())]
    Kubeconfig { path: PathBuf, cause: serde_yaml::Error },
}

/// Result type of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io_error(step: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Error {
    let path = path.to_path_buf();
    move |cause| Error::Io { step, path, cause }
}

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The cluster CA: its certificate and the issuer used to sign leaves.
struct Ca {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
    roots: Arc<RootCertStore>,
    path: PathBuf,
}

/// A leaf certificate and its private key.
struct Leaf {
    cert_pem: String,
    key_pem: String,
}

impl Leaf {
    fn cert_der(&self) -> Result<CertificateDer<'static>, String> {
        CertificateDer::from_pem_slice(self.cert_pem.as_bytes()).map_err(|e| e.to_string())
    }

    fn key_der(&self) -> Result<PrivateKeyDer<'static>, String> {
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).map_err(|e| e.to_string())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeafKind {
    Serving,
    Admin,
    /// The node endpoint's serving certificate.
    KubeletServing,
    /// The API server's client certificate for node endpoints.
    KubeletClient,
}

impl LeafKind {
    fn describe(self) -> &'static str {
        match self {
            Self::Serving => "serving certificate",
            Self::Admin => "admin client certificate",
            Self::KubeletServing => "node endpoint serving certificate",
            Self::KubeletClient => "node endpoint client certificate",
        }
    }

    fn file(self) -> &'static str {
        match self {
            Self::Serving => "serving",
            Self::Admin => "client-admin",
            Self::KubeletServing => "serving-kubelet",
            Self::KubeletClient => "client-kube-apiserver-kubelet",
        }
    }

    fn cert_path(self, dir: &Path) -> PathBuf {
        dir.join(format!("{}.crt", self.file()))
    }

    fn key_path(self, dir: &Path) -> PathBuf {
        dir.join(format!("{}.key", self.file()))
    }

    fn is_serving(self) -> bool {
        matches!(self, Self::Serving | Self::KubeletServing)
    }

    /// The subject of a client certificate.
    fn client_subject(self) -> (&'static str, Option<&'static str>) {
        match self {
            Self::KubeletClient => (KUBELET_CLIENT_USER, None),
            _ => (ADMIN_USER, Some(ADMIN_GROUP)),
        }
    }
}

/// Certificates and keys of the API server, kept under one directory.
pub struct Pki {
    dir: PathBuf,
    sans: Vec<SanType>,
    /// The node endpoint's SANs: loopback, the hostname and the node's addresses.
    kubelet_sans: Vec<SanType>,
    ca: Ca,
    admin: RwLock<Leaf>,
    resolver: Arc<SwappableCert>,
    kubelet_resolver: Arc<SwappableCert>,
    kubelet_client: RwLock<Leaf>,
    renewal: Mutex<()>,
}

impl fmt::Debug for Pki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pki").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl Pki {
    /// Loads the TLS material under `dir`, creating or re-issuing what is
    /// missing or unusable.
    ///
    /// The serving certificate covers `localhost`, the loopback addresses,
    /// `hostname`, `node_ips`, the in-cluster `kubernetes` service names and
    /// every entry of `tls_sans` (IP address or DNS name).
    pub fn load_or_create(dir: &Path, hostname: &str, node_ips: &[IpAddr], tls_sans: &[String]) -> Result<Self> {
        let sans = wanted_sans(hostname, node_ips, tls_sans)?;
        let kubelet_sans = kubelet_sans(hostname, node_ips)?;
        create_private_dir(dir)?;
        let (ca, ca_created) = load_or_create_ca(dir)?;
        let (serving, _) = check_or_issue(dir, &ca, LeafKind::Serving, &sans, ca_created)?;
        let (admin, _) = check_or_issue(dir, &ca, LeafKind::Admin, &[], ca_created)?;
        let (kubelet_serving, _) = check_or_issue(dir, &ca, LeafKind::KubeletServing, &kubelet_sans, ca_created)?;
        let (kubelet_client, _) = check_or_issue(dir, &ca, LeafKind::KubeletClient, &[], ca_created)?;
        let resolver = Arc::new(SwappableCert::new(certified_key(dir, LeafKind::Serving, &serving)?));
        let kubelet_resolver =
            Arc::new(SwappableCert::new(certified_key(dir, LeafKind::KubeletServing, &kubelet_serving)?));
        Ok(Self {
            dir: dir.to_path_buf(),
            sans,
            kubelet_sans,
            ca,
            admin: RwLock::new(admin),
            resolver,
            kubelet_resolver,
            kubelet_client: RwLock::new(kubelet_client),
            renewal: Mutex::new(()),
        })
    }

    /// Re-checks the leaf certificates on disk and re-issues those that need it,
    /// swapping a renewed serving certificate into running listeners. Returns
    /// whether anything was re-issued; the caller should then rewrite kubeconfigs.
    pub fn renew_if_needed(&self) -> Result<bool> {
        let _guard = self.renewal.lock().unwrap_or_else(PoisonError::into_inner);
        let (serving, serving_renewed) = check_or_issue(&self.dir, &self.ca, LeafKind::Serving, &self.sans, false)?;
        let (admin, admin_renewed) = check_or_issue(&self.dir, &self.ca, LeafKind::Admin, &[], false)?;
        let (kubelet_serving, kubelet_serving_renewed) =
            check_or_issue(&self.dir, &self.ca, LeafKind::KubeletServing, &self.kubelet_sans, false)?;
        let (kubelet_client, kubelet_client_renewed) =
            check_or_issue(&self.dir, &self.ca, LeafKind::KubeletClient, &[], false)?;
        if serving_renewed {
            self.resolver.set(certified_key(&self.dir, LeafKind::Serving, &serving)?);
        }
        if admin_renewed {
            *self.admin.write().unwrap_or_else(PoisonError::into_inner) = admin;
        }
        if kubelet_serving_renewed {
            self.kubelet_resolver.set(certified_key(&self.dir, LeafKind::KubeletServing, &kubelet_serving)?);
        }
        if kubelet_client_renewed {
            *self.kubelet_client.write().unwrap_or_else(PoisonError::into_inner) = kubelet_client;
        }
        Ok(serving_renewed || admin_renewed)
    }

    /// Runs [`Pki::renew_if_needed`] every `every`, calling `on_renewed` after a
    /// renewal (e.g. to rewrite the admin kubeconfig). Must be called inside a
    /// Tokio runtime.
    pub fn spawn_renewal<F>(self: Arc<Self>, every: std::time::Duration, on_renewed: F) -> tokio::task::JoinHandle<()>
    where
        F: Fn(&Pki) + Send + Sync + 'static,
    {
        let on_renewed = Arc::new(on_renewed);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await; // The first tick fires at once; loading just checked.
            loop {
                ticks.tick().await;
                let (pki, on_renewed) = (self.clone(), on_renewed.clone());
                let outcome = tokio::task::spawn_blocking(move || {
                    let renewed = pki.renew_if_needed()?;
                    if renewed {
                        on_renewed(&pki);
                    }
                    Ok::<_, Error>(())
                })
                .await;
                match outcome {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => warn!("certificate renewal check failed: {e}"),
                    Err(e) => warn!("certificate renewal task failed: {e}"),
                }
            }
        })
    }

    /// TLS configuration for the API server: TLS 1.2 and 1.3, ALPN `h2` and
    /// `http/1.1`, optional client certificates that must chain to the CA, and
    /// the hot-swappable serving certificate.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>> {
        self.tls_server(self.resolver.clone(), "selecting TLS versions for the API server")
    }

    /// TLS configuration for the node endpoint: as the API server's, with its own certificate.
    pub fn kubelet_server_config(&self) -> Result<Arc<rustls::ServerConfig>> {
        self.tls_server(self.kubelet_resolver.clone(), "selecting TLS versions for the node endpoint")
    }

    /// TLS configuration the API server calls node endpoints with: the cluster CA as the only
    /// trust anchor, and the current node endpoint client certificate.
    pub fn kubelet_client_config(&self) -> Result<Arc<rustls::ClientConfig>> {
        let leaf = self.kubelet_client.read().unwrap_or_else(PoisonError::into_inner);
        let path = LeafKind::KubeletClient.cert_path(&self.dir);
        let unusable = |reason: String| Error::Unusable { path: path.clone(), reason };
        let (cert, key) = (leaf.cert_der().map_err(unusable)?, leaf.key_der().map_err(unusable)?);
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|cause| Error::Tls { step: "selecting TLS versions for node endpoint calls", cause })?
            .with_root_certificates(self.ca.roots.clone())
            .with_client_auth_cert(vec![cert], key)
            .map_err(|cause| Error::Tls { step: "loading the node endpoint client certificate", cause })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    fn tls_server(&self, resolver: Arc<SwappableCert>, step: &'static str) -> Result<Arc<rustls::ServerConfig>> {
        server_tls(self.ca.roots.clone(), &self.ca.path, resolver, step)
    }

    /// Signs a joining node's credentials (k3s's `client-kubelet.crt` and `serving-kubelet.crt`):
    /// the node keeps its keys and sends certificate requests, and only their public keys are used;
    /// the server decides every name: `system:node:<node>` in `system:nodes` for the client
    /// certificate, the node's name and `addresses` for the serving one. Returns both, PEM-encoded.
    pub fn sign_node(
        &self,
        node: &str,
        addresses: &[IpAddr],
        client_csr: &str,
        serving_csr: &str,
        controller_csr: &str,
    ) -> Result<(String, String, String), String> {
        let user = format!("system:node:{node}");
        let public_key = |csr: &str, what: &str| {
            rcgen::CertificateSigningRequestParams::from_pem(csr)
                .map(|r| r.public_key)
                .map_err(|e| format!("the {what} certificate request is not a valid PEM CSR: {e}"))
        };
        let mut client = leaf_params(LEAF_VALIDITY);
        client.distinguished_name = dn(&user, Some(NODES_GROUP));
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let mut serving = leaf_params(LEAF_VALIDITY);
        serving.distinguished_name = dn(&user, Some(NODES_GROUP));
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let names = ["localhost", node].into_iter().filter_map(parse_san).collect::<Result<Vec<_>>>();
        serving.subject_alt_names = names.map_err(|e| e.to_string())?;
        serving.subject_alt_names.extend(addresses.iter().map(|ip| SanType::IpAddress(*ip)));
        let mut controller = leaf_params(LEAF_VALIDITY);
        controller.distinguished_name = dn(super::authz::CONTROLLER_USER, None);
        controller.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let sign = |params: CertificateParams, csr: &str, what: &str| {
            params
                .signed_by(&public_key(csr, what)?, &self.ca.issuer)
                .map(|c| c.pem())
                .map_err(|e| format!("signing the node's {what} certificate: {e}"))
        };
        Ok((
            sign(client, client_csr, "client")?,
            sign(serving, serving_csr, "serving")?,
            sign(controller, controller_csr, "controllers' client")?,
        ))
    }

    /// Signs a client certificate request as kube-controller-manager's `kube-apiserver-client`
    /// signer does: the request's own subject (rcgen keeps one value per attribute), client
    /// authentication, valid for `validity` but at most a year. The error says why it cannot be.
    pub fn sign_client_request(&self, request_pem: &str, validity: std::time::Duration) -> Result<String, String> {
        let csr = rcgen::CertificateSigningRequestParams::from_pem(request_pem)
            .map_err(|e| format!("unable to parse the certificate request: {e}"))?;
        let validity = time::Duration::try_from(validity).unwrap_or(LEAF_VALIDITY).min(LEAF_VALIDITY);
        let mut params = leaf_params(validity);
        params.distinguished_name = csr.params.distinguished_name.clone();
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params
            .signed_by(&csr.public_key, &self.ca.issuer)
            .map(|c| c.pem())
            .map_err(|e| format!("signing the certificate: {e}"))
    }

    /// The CA certificate, PEM-encoded.
    pub fn ca_pem(&self) -> &str {
        &self.ca.cert_pem
    }

    /// The CA certificate, DER-encoded.
    #[cfg(test)]
    fn ca_der(&self) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(self.ca.cert_pem.as_bytes()).expect("the CA certificate is valid PEM")
    }

    /// The current admin client certificate and private key, PEM-encoded.
    pub fn admin_pem(&self) -> (String, String) {
        let admin = self.admin.read().unwrap_or_else(PoisonError::into_inner);
        (admin.cert_pem.clone(), admin.key_pem.clone())
    }

    /// The resolver serving the current serving certificate.
    #[cfg(test)]
    fn serving_resolver(&self) -> Arc<SwappableCert> {
        self.resolver.clone()
    }
}

/// Serves the current serving certificate; swapped in place on renewal.
#[derive(Debug)]
pub struct SwappableCert(RwLock<Arc<CertifiedKey>>);

impl SwappableCert {
    pub fn new(key: CertifiedKey) -> Self {
        Self(RwLock::new(Arc::new(key)))
    }

    pub fn set(&self, key: CertifiedKey) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(key);
    }

    /// The certificate and key handed to new connections.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl ResolvesServerCert for SwappableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// A joined node's client certificate, swapped in place when it is renewed.
impl rustls::client::ResolvesClientCert for SwappableCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
    fn has_certs(&self) -> bool {
        true
    }
}

/// A TLS server configuration with `resolver`'s certificate: TLS 1.2 and 1.3, ALPN `h2` and
/// `http/1.1`, and optional client certificates that must chain to `roots` (the CA at `ca_path`).
pub fn server_tls(
    roots: Arc<RootCertStore>,
    ca_path: &Path,
    resolver: Arc<SwappableCert>,
    step: &'static str,
) -> Result<Arc<rustls::ServerConfig>> {
    let provider = provider();
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|cause| Error::Verifier { path: ca_path.to_path_buf(), cause })?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|cause| Error::Tls { step, cause })?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A TLS client configuration trusting only `roots` and presenting `identity`'s certificate (no
/// ALPN: the HTTP connector sets it).
pub fn client_tls(roots: Arc<RootCertStore>, identity: Arc<SwappableCert>) -> Result<Arc<rustls::ClientConfig>> {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|cause| Error::Tls { step: "selecting TLS versions for the API client", cause })?
        .with_root_certificates(roots)
        .with_client_cert_resolver(identity);
    Ok(Arc::new(config))
}

/// The trust anchors of a CA bundle (PEM, one or more certificates).
pub fn roots_of(ca_pem: &str) -> Result<Arc<RootCertStore>, String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| format!("the CA bundle is not valid PEM: {e}"))?;
        roots.add(cert).map_err(|e| format!("the CA bundle holds an unusable certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err("the CA bundle holds no certificate".into());
    }
    Ok(Arc::new(roots))
}

/// A certificate chain (PEM) and its private key (PEM) as rustls serves or presents them.
pub fn certified_key_of(cert_pem: &str, key_pem: &str) -> Result<CertifiedKey, String> {
    let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the certificate is not valid PEM: {e}"))?;
    let key =
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| format!("the key is not valid PEM: {e}"))?;
    CertifiedKey::from_der(certs, key, &provider()).map_err(|e| format!("the certificate does not match its key: {e}"))
}

/// Why a certificate (PEM) must be re-issued, if it must: it expires within the renewal window,
/// or does not chain to `roots` as a client certificate (`serving_for` is `None`) or as a serving
/// certificate covering every address of `serving_for`.
pub fn check_issued(cert_pem: &str, roots: &Arc<RootCertStore>, serving_for: Option<&[IpAddr]>) -> Result<(), String> {
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| e.to_string())?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| e.to_string())?;
    let expires = cert.validity().not_after;
    if expires.timestamp() < (OffsetDateTime::now_utc() + RENEW_BEFORE).unix_timestamp() {
        return Err(format!("it expires at {expires}, within {} days", RENEW_BEFORE.whole_days()));
    }
    let now = UnixTime::now();
    let chained = match serving_for {
        Some(addresses) => {
            let verifier = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider())
                .build()
                .map_err(|e| e.to_string())?;
            let mut names: Vec<ServerName<'static>> =
                addresses.iter().map(|ip| ServerName::IpAddress((*ip).into())).collect();
            names.push(ServerName::try_from("localhost").map_err(|e| e.to_string())?);
            names.iter().try_for_each(|name| verifier.verify_server_cert(&der, &[], name, &[], now).map(drop))
        }
        None => WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
            .build()
            .map_err(|e| e.to_string())?
            .verify_client_cert(&der, &[], now)
            .map(drop),
    };
    chained.map_err(|e| format!("it is not valid for this node and the server's CA: {e}"))
}

/// A new private key (ECDSA P-256, as every key here), PEM-encoded.
pub fn new_key_pem() -> Result<String, String> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map(|k| k.serialize_pem()).map_err(|e| e.to_string())
}

/// A certificate request (PEM) for an existing key (PEM), naming `common_name` (the signer
/// decides the names; the request only proves the key).
pub fn request_for(key_pem: &str, common_name: &str) -> Result<String, String> {
    let key = KeyPair::from_pem(key_pem).map_err(|e| format!("the key is unusable: {e}"))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = dn(common_name, None);
    params.serialize_request(&key).and_then(|r| r.pem()).map_err(|e| e.to_string())
}

/// Accepts any server certificate, still checking the handshake's signatures made with it: for
/// HTTPS probes (kubelet verifies nothing there) and a joining node's fetch of `/cacerts`, whose
/// body is then trusted by its hash, not by the connection.
#[derive(Debug)]
pub struct AnyServerCert(Arc<CryptoProvider>);

impl AnyServerCert {
    pub fn new() -> Arc<Self> {
        Arc::new(Self(provider()))
    }
}

impl ServerCertVerifier for AnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// User (subject CN) and groups (subject O) of a verified client certificate
/// chain, leaf first.
pub fn client_identity(certs: &[CertificateDer<'_>]) -> Option<(String, Vec<String>)> {
    let (_, cert) = x509_parser::parse_x509_certificate(certs.first()?).ok()?;
    let subject = cert.subject();
    let user = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
    let groups = subject.iter_organization().filter_map(|o| o.as_str().ok()).map(str::to_owned).collect();
    Some((user, groups))
}

/// Writes an admin kubeconfig atomically, with permissions `mode` set before any credential is
/// written; parent directories are created as needed. Its first server is `default` (cluster,
/// user and context all named so, as k3s's) and the current context; every other server of
/// `servers` (name, URL) gets a cluster and context of that name, with the same user.
pub fn write_kubeconfig(path: &Path, mode: u32, servers: &[(String, String)], pki: &Pki) -> Result<()> {
    let (cert_pem, key_pem) = pki.admin_pem();
    let config = kubeconfig(servers, pki.ca_pem(), &cert_pem, &key_pem);
    let yaml = serde_yaml::to_string(&config).map_err(|cause| Error::Kubeconfig { path: path.to_path_buf(), cause })?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(io_error("creating directory", parent))?;
    }
    write_atomic(path, mode, yaml.as_bytes())?;
    info!("wrote admin kubeconfig {}", path.display());
    Ok(())
}

/// A kubeconfig for a client certificate: a cluster and a context per server (name, URL), all
/// with the user `default`; the first is the current context.
fn kubeconfig(servers: &[(String, String)], ca_pem: &str, cert_pem: &str, key_pem: &str) -> serde_json::Value {
    let ca = BASE64.encode(ca_pem);
    let clusters: Vec<_> = servers
        .iter()
        .map(|(name, url)| serde_json::json!({"cluster": {"certificate-authority-data": ca, "server": url}, "name": name}))
        .collect();
    let contexts: Vec<_> = servers
        .iter()
        .map(|(name, _)| serde_json::json!({"context": {"cluster": name, "user": "default"}, "name": name}))
        .collect();
    serde_json::json!({
        "apiVersion": "v1",
        "clusters": clusters,
        "contexts": contexts,
        "current-context": servers.first().map_or("default", |(name, _)| name.as_str()),
        "kind": "Config",
        "preferences": {},
        "users": [{
            "name": "default",
            "user": {
                "client-certificate-data": BASE64.encode(cert_pem),
                "client-key-data": BASE64.encode(key_pem),
            },
        }],
    })
}

/// A kubeconfig for `user` (in `group`, when given) with a new key and a client certificate
/// from the cluster CA in `dir`, valid for a year; neither is kept on the server.
pub fn user_kubeconfig(dir: &Path, server_url: &str, user: &str, group: Option<&str>) -> Result<String> {
    let cert_path = dir.join(CA_CERT);
    if !cert_path.exists() || !dir.join(CA_KEY).exists() {
        return Err(Error::Unusable {
            path: cert_path,
            reason: "there is no cluster CA here: give the server's --data-dir, and run this as its user".into(),
        });
    }
    let (ca, _) = load_or_create_ca(dir)?;
    let key = KeyPair::generate().map_err(|cause| Error::Generate { what: "a key", path: cert_path.clone(), cause })?;
    let mut params = leaf_params(LEAF_VALIDITY);
    params.distinguished_name = dn(user, group);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &ca.issuer).map_err(|cause| Error::Generate {
        what: "the client certificate",
        path: cert_path.clone(),
        cause,
    })?;
    let servers = [("default".to_string(), server_url.to_string())];
    let config = kubeconfig(&servers, &ca.cert_pem, &cert.pem(), &key.serialize_pem());
    serde_yaml::to_string(&config).map_err(|cause| Error::Kubeconfig { path: cert_path, cause })
}

/// The SANs the serving certificate must carry, deduplicated.
fn wanted_sans(hostname: &str, node_ips: &[IpAddr], tls_sans: &[String]) -> Result<Vec<SanType>> {
    let names = [
        "localhost",
        "127.0.0.1",
        "::1",
        hostname,
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ];
    let mut sans: Vec<SanType> = Vec::new();
    let ips = node_ips.iter().map(|ip| Ok(SanType::IpAddress(*ip)));
    let named = names.into_iter().chain(tls_sans.iter().map(String::as_str));
    for san in named.filter_map(parse_san).chain(ips) {
        let san = san?;
        if !sans.contains(&san) {
            sans.push(san);
        }
    }
    Ok(sans)
}

/// The SANs of the node endpoint's certificate: loopback, the hostname and the node's addresses
/// (the API server reaches its own node on loopback, another by its InternalIP).
fn kubelet_sans(hostname: &str, node_ips: &[IpAddr]) -> Result<Vec<SanType>> {
    let mut sans: Vec<SanType> = Vec::new();
    let ips = node_ips.iter().map(|ip| Ok(SanType::IpAddress(*ip)));
    for san in ["localhost", "127.0.0.1", "::1", hostname].into_iter().filter_map(parse_san).chain(ips) {
        let san = san?;
        if !sans.contains(&san) {
            sans.push(san);
        }
    }
    Ok(sans)
}

/// Classifies a name as IP address or DNS name; `None` for blank input.
fn parse_san(raw: &str) -> Option<Result<SanType>> {
    let name = raw.trim();
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    if bare.is_empty() {
        return None;
    }
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Some(Ok(SanType::IpAddress(ip)));
    }
    let valid = name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '*'));
    Some(match Ia5String::try_from(name.to_ascii_lowercase()) {
        Ok(dns) if valid => Ok(SanType::DnsName(dns)),
        _ => Err(Error::InvalidSan(raw.to_owned())),
    })
}

fn san_to_string(san: &SanType) -> String {
    match san {
        SanType::DnsName(name) => name.as_str().to_owned(),
        SanType::IpAddress(ip) => ip.to_string(),
        other => format!("{other:?}"),
    }
}

pub(super) fn create_private_dir(dir: &Path) -> Result<()> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(io_error("creating directory", parent))?;
    }
    match DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(io_error("creating directory", dir)(e));
        }
        _ => {}
    }
    fs::set_permissions(dir, Permissions::from_mode(0o700)).map_err(io_error("restricting permissions of", dir))
}

/// Writes `contents` to a temporary file created with `mode`, then renames it
/// over `path`.
/// Writes a file atomically (a temporary beside it, synced, renamed into place) with exactly `mode`
/// set before any of `contents` is written.
pub fn write_atomic(path: &Path, mode: u32, contents: &[u8]) -> Result<()> {
    let name = path.file_name().unwrap_or(path.as_os_str()).to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .map_err(io_error("creating", &tmp))?;
        // The umask may have narrowed `mode`; apply it exactly before writing.
        file.set_permissions(Permissions::from_mode(mode)).map_err(io_error("setting permissions of", &tmp))?;
        file.write_all(contents).map_err(io_error("writing", &tmp))?;
        file.sync_all().map_err(io_error("syncing", &tmp))?;
        fs::rename(&tmp, path).map_err(io_error("renaming into place", path))
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

fn read_if_exists(path: &Path) -> Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(cause) => Err(io_error("reading", path)(cause)),
    }
}

fn new_key(path: &Path) -> Result<KeyPair> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|cause| Error::Generate {
        what: "a private key",
        path: path.to_path_buf(),
        cause,
    })
}

fn dn(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn
}

/// Loads the CA, or creates it when its certificate or key is missing.
/// Returns whether it was created.
fn load_or_create_ca(dir: &Path) -> Result<(Ca, bool)> {
    let (cert_path, key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
    let unusable = |path: &Path, reason: String| Error::Unusable { path: path.to_path_buf(), reason };
    let missing = match (read_if_exists(&cert_path)?, read_if_exists(&key_path)?) {
        (Some(cert_pem), Some(key_pem)) => {
            let key =
                KeyPair::from_pem(&key_pem).map_err(|e| unusable(&key_path, format!("parsing the CA key: {e}")))?;
            let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
                .map_err(|e| unusable(&cert_path, format!("parsing the CA certificate: {e}")))?;
            let (_, cert) = x509_parser::parse_x509_certificate(&cert_der)
                .map_err(|e| unusable(&cert_path, format!("parsing the CA certificate: {e}")))?;
            if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
                let reason = format!("the CA certificate does not match {CA_KEY}");
                return Err(unusable(&cert_path, reason));
            }
            let expires = cert.validity().not_after;
            if expires.timestamp() < (OffsetDateTime::now_utc() + RENEW_BEFORE).unix_timestamp() {
                warn!("cluster CA {} expires at {expires}; it is never renewed automatically", cert_path.display());
            }
            let issuer = Issuer::from_ca_cert_der(&cert_der, key)
                .map_err(|e| unusable(&cert_path, format!("loading the CA certificate: {e}")))?;
            return Ok((Ca::new(cert_path, cert_pem, cert_der, issuer)?, false));
        }
        (None, _) => CA_CERT,
        (Some(_), None) => CA_KEY,
    };
    info!("creating a new cluster CA in {} because {missing} is missing", dir.display());
    let key = new_key(&key_path)?;
    let now = OffsetDateTime::now_utc();
    let mut params = CertificateParams::default();
    let common_name = format!("cairn-server-ca@{}", now.unix_timestamp());
    params.distinguished_name = dn(&common_name, None);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.not_before = now - BACKDATE;
    params.not_after = now + CA_VALIDITY;
    let cert = params.self_signed(&key).map_err(|cause| Error::Generate {
        what: "the CA certificate",
        path: cert_path.clone(),
        cause,
    })?;
    write_atomic(&key_path, 0o600, key.serialize_pem().as_bytes())?;
    write_atomic(&cert_path, 0o644, cert.pem().as_bytes())?;
    let issuer = Issuer::new(params, key);
    Ok((Ca::new(cert_path, cert.pem(), cert.der().clone(), issuer)?, true))
}

impl Ca {
    fn new(
        path: PathBuf,
        cert_pem: String,
        cert_der: CertificateDer<'static>,
        issuer: Issuer<'static, KeyPair>,
    ) -> Result<Self> {
        let mut roots = RootCertStore::empty();
        roots.add(cert_der).map_err(|e| Error::Unusable {
            path: path.clone(),
            reason: format!("using the CA certificate as trust anchor: {e}"),
        })?;
        Ok(Self { cert_pem, issuer, roots: Arc::new(roots), path })
    }
}

/// Loads a leaf, re-issuing it when needed (always when `force` is set).
/// Returns the leaf and whether it was issued.
fn check_or_issue(dir: &Path, ca: &Ca, kind: LeafKind, sans: &[SanType], force: bool) -> Result<(Leaf, bool)> {
    let cert_path = kind.cert_path(dir);
    let reason = if force {
        "the cluster CA was regenerated".to_owned()
    } else {
        match check_leaf(dir, ca, kind, sans) {
            Ok(leaf) => return Ok((leaf, false)),
            Err(reason) => reason,
        }
    };
    info!("issuing a new {} {} because {reason}", kind.describe(), cert_path.display());
    let leaf = issue_leaf(dir, ca, kind, sans, LEAF_VALIDITY)?;
    write_leaf(dir, kind, &leaf)?;
    Ok((leaf, true))
}

/// Reads a leaf from disk; `Err` says why it must be re-issued.
fn check_leaf(dir: &Path, ca: &Ca, kind: LeafKind, sans: &[SanType]) -> Result<Leaf, String> {
    let read = |path: PathBuf| match fs::read_to_string(&path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(format!("{} does not exist", path.display())),
        Err(e) => Err(format!("{} is unreadable: {e}", path.display())),
    };
    let leaf = Leaf { cert_pem: read(kind.cert_path(dir))?, key_pem: read(kind.key_path(dir))? };
    let corrupt = |what: &str, e: String| format!("the {what} is corrupt: {e}");
    let cert_der = leaf.cert_der().map_err(|e| corrupt("certificate", e))?;
    let (_, cert) =
        x509_parser::parse_x509_certificate(&cert_der).map_err(|e| corrupt("certificate", e.to_string()))?;
    let key = KeyPair::from_pem(&leaf.key_pem).map_err(|e| corrupt("private key", e.to_string()))?;
    if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Err("the private key does not match the certificate".to_owned());
    }
    let expires = cert.validity().not_after;
    if expires.timestamp() < (OffsetDateTime::now_utc() + RENEW_BEFORE).unix_timestamp() {
        return Err(format!("it expires at {expires}, within {} days", RENEW_BEFORE.whole_days()));
    }
    if kind.is_serving() {
        let present = cert_sans(&cert);
        let missing: Vec<String> = sans.iter().filter(|san| !present.contains(san)).map(san_to_string).collect();
        if !missing.is_empty() {
            return Err(format!("it does not cover {}", missing.join(", ")));
        }
    } else {
        let (user, group) = kind.client_subject();
        let wanted = (user.to_owned(), group.into_iter().map(str::to_owned).collect());
        if client_identity(std::slice::from_ref(&cert_der)) != Some(wanted) {
            return Err(format!("its subject is not {user}{}", group.map(|g| format!(" in {g}")).unwrap_or_default()));
        }
    }
    verify_leaf(ca, kind, &cert_der).map_err(|e| format!("it does not verify against the cluster CA: {e}"))?;
    Ok(leaf)
}

/// Verifies the chain, validity period and extended key usage of a leaf.
fn verify_leaf(ca: &Ca, kind: LeafKind, cert: &CertificateDer<'_>) -> Result<(), String> {
    let now = UnixTime::now();
    match kind {
        LeafKind::Serving | LeafKind::KubeletServing => {
            let verifier = WebPkiServerVerifier::builder_with_provider(ca.roots.clone(), provider())
                .build()
                .map_err(|e| e.to_string())?;
            let name = ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
            verifier.verify_server_cert(cert, &[], &name, &[], now).map(drop)
        }
        LeafKind::Admin | LeafKind::KubeletClient => {
            let verifier = WebPkiClientVerifier::builder_with_provider(ca.roots.clone(), provider())
                .build()
                .map_err(|e| e.to_string())?;
            verifier.verify_client_cert(cert, &[], now).map(drop)
        }
    }
    .map_err(|e| e.to_string())
}

/// DNS names (lowercased) and IP addresses in a certificate's SAN extension.
fn cert_sans(cert: &x509_parser::certificate::X509Certificate<'_>) -> Vec<SanType> {
    let Ok(Some(ext)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    ext.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Ia5String::try_from(dns.to_ascii_lowercase()).ok().map(SanType::DnsName),
            GeneralName::IPAddress(bytes) => match bytes.len() {
                4 => <[u8; 4]>::try_from(*bytes).ok().map(|b| SanType::IpAddress(Ipv4Addr::from(b).into())),
                16 => <[u8; 16]>::try_from(*bytes).ok().map(|b| SanType::IpAddress(Ipv6Addr::from(b).into())),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// A leaf's parameters valid from now (backdated) for `validity`, with its names still to set.
fn leaf_params(validity: time::Duration) -> CertificateParams {
    let now = OffsetDateTime::now_utc();
    let mut params = CertificateParams::default();
    params.not_before = now - BACKDATE;
    params.not_after = now + validity;
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params
}

/// Issues a new key and certificate for `kind`, signed by the CA.
fn issue_leaf(dir: &Path, ca: &Ca, kind: LeafKind, sans: &[SanType], validity: time::Duration) -> Result<Leaf> {
    let key = new_key(&kind.key_path(dir))?;
    let mut params = leaf_params(validity);
    if kind.is_serving() {
        params.distinguished_name = dn("cairn", Some("cairn"));
        params.subject_alt_names = sans.to_vec();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    } else {
        let (user, group) = kind.client_subject();
        params.distinguished_name = dn(user, group);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    }
    let cert = params.signed_by(&key, &ca.issuer).map_err(|cause| Error::Generate {
        what: kind.describe(),
        path: kind.cert_path(dir),
        cause,
    })?;
    Ok(Leaf { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

fn write_leaf(dir: &Path, kind: LeafKind, leaf: &Leaf) -> Result<()> {
    write_atomic(&kind.key_path(dir), 0o600, leaf.key_pem.as_bytes())?;
    write_atomic(&kind.cert_path(dir), 0o644, leaf.cert_pem.as_bytes())
}

fn certified_key(dir: &Path, kind: LeafKind, leaf: &Leaf) -> Result<CertifiedKey> {
    let unusable = |path: PathBuf, reason: String| Error::Unusable { path, reason };
    let cert = leaf.cert_der().map_err(|e| unusable(kind.cert_path(dir), e))?;
    let key = leaf.key_der().map_err(|e| unusable(kind.key_path(dir), e))?;
    CertifiedKey::from_der(vec![cert], key, &provider())
        .map_err(|cause| Error::Tls { step: "loading the serving certificate and key", cause })
}

/// The join token in k3s's form, `K10<sha256 of the CA certificate>::server:<secret>`: the hash
/// pins the server's CA, so a node never trusts a server it was not told about. A bare secret
/// (k3s's short form) is accepted too, without the pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinToken {
    /// Hex sha256 of the CA bundle `/cacerts` serves.
    pub ca_hash: Option<String>,
    pub secret: String,
}

impl JoinToken {
    pub fn parse(text: &str) -> Result<JoinToken, String> {
        let text = text.trim();
        if let Some(rest) = text.strip_prefix("K10")
            && let Some((hash, credentials)) = rest.split_once("::")
        {
            let form = "expected K10<sha256 of the CA, 64 hex digits>::server:<secret>";
            if hash.len() != 64 || !hash.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(format!("the token's CA hash {hash:?} is not a sha256: {form}"));
            }
            let secret = credentials.split_once(':').map(|(_, secret)| secret).unwrap_or_default();
            if secret.is_empty() {
                return Err(format!("the token has no secret after its CA hash: {form}"));
            }
            return Ok(JoinToken { ca_hash: Some(hash.to_ascii_lowercase()), secret: secret.to_string() });
        }
        if text.is_empty() {
            return Err("the token is empty".into());
        }
        Ok(JoinToken { ca_hash: None, secret: text.to_string() })
    }

    /// The full token for `secret` on the server whose CA is `ca_pem`.
    pub fn full(ca_pem: &str, secret: &str) -> String {
        format!("K10{}::server:{secret}", ca_hash(ca_pem))
    }
}

/// Hex sha256 of the CA bundle, as k3s's token carries it.
pub fn ca_hash(ca_pem: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(ca_pem.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::PrivatePkcs8KeyDer;
    use rustls::{ClientConfig, ClientConnection, Connection, ServerConnection};

    fn load(dir: &Path, sans: &[&str]) -> Pki {
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let node_ips = ["10.0.0.5".parse().unwrap()];
        Pki::load_or_create(dir, "node1", &node_ips, &sans).unwrap()
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    fn read(dir: &Path, name: &str) -> String {
        fs::read_to_string(dir.join(name)).unwrap()
    }

    fn not_after(pem: &str) -> i64 {
        let der = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        cert.validity().not_after.timestamp()
    }

    #[test]
    fn creates_material_with_private_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("server/tls");
        let pki = load(&dir, &["api.example.com", "192.168.1.9"]);
        assert_eq!(mode(&dir), 0o700);
        for key in ["server-ca.key", "serving.key", "client-admin.key"] {
            assert_eq!(mode(&dir.join(key)), 0o600, "{key}");
        }
        for cert in ["server-ca.crt", "serving.crt", "client-admin.crt"] {
            assert_eq!(mode(&dir.join(cert)), 0o644, "{cert}");
        }
        assert_eq!(pki.ca_pem(), read(&dir, "server-ca.crt"));

        let der = pki.ca_der();
        let (_, ca) = x509_parser::parse_x509_certificate(&der).unwrap();
        let cn = ca.subject().iter_common_name().next().unwrap();
        assert!(cn.as_str().unwrap().starts_with("cairn-server-ca@"));
        assert!(ca.is_ca());

        let serving = CertificateDer::from_pem_slice(read(&dir, "serving.crt").as_bytes()).unwrap();
        let (_, serving) = x509_parser::parse_x509_certificate(&serving).unwrap();
        let sans: Vec<String> = cert_sans(&serving).iter().map(san_to_string).collect();
        for want in [
            "localhost",
            "127.0.0.1",
            "::1",
            "node1",
            "10.0.0.5",
            "kubernetes.default.svc.cluster.local",
            "api.example.com",
            "192.168.1.9",
        ] {
            assert!(sans.iter().any(|s| s == want), "{want} missing from {sans:?}");
        }
        let days_left = (serving.validity().not_after.timestamp() - OffsetDateTime::now_utc().unix_timestamp()) / 86400;
        assert!((364..=365).contains(&days_left));
    }

    #[test]
    fn reuses_material_on_reload() {
        let tmp = tempfile::tempdir().unwrap();
        let first = load(tmp.path(), &[]);
        let files = ["server-ca.crt", "serving.crt", "serving.key", "client-admin.crt"];
        let before: Vec<String> = files.iter().map(|f| read(tmp.path(), f)).collect();
        let second = load(tmp.path(), &[]);
        let after: Vec<String> = files.iter().map(|f| read(tmp.path(), f)).collect();
        assert_eq!(before, after);
        assert_eq!(first.admin_pem(), second.admin_pem());
        assert!(!second.renew_if_needed().unwrap());
    }

    #[test]
    fn renews_serving_cert_near_expiry_and_swaps_it() {
        let tmp = tempfile::tempdir().unwrap();
        let pki = load(tmp.path(), &[]);
        let short = issue_leaf(tmp.path(), &pki.ca, LeafKind::Serving, &pki.sans, time::Duration::days(10)).unwrap();
        write_leaf(tmp.path(), LeafKind::Serving, &short).unwrap();
        let ca_before = read(tmp.path(), "server-ca.crt");

        assert!(pki.renew_if_needed().unwrap());
        let renewed = read(tmp.path(), "serving.crt");
        assert_ne!(renewed, short.cert_pem);
        assert!(not_after(&renewed) - OffsetDateTime::now_utc().unix_timestamp() > 300 * 86400);
        assert_eq!(read(tmp.path(), "server-ca.crt"), ca_before);
        let served = pki.serving_resolver().current();
        let served_pem = CertificateDer::from_pem_slice(renewed.as_bytes()).unwrap();
        assert_eq!(served.cert[0], served_pem);
        assert!(!pki.renew_if_needed().unwrap());
    }

    #[test]
    fn san_change_reissues_serving_cert() {
        let tmp = tempfile::tempdir().unwrap();
        load(tmp.path(), &["a.example.com"]);
        let before = read(tmp.path(), "serving.crt");
        let admin_before = read(tmp.path(), "client-admin.crt");
        load(tmp.path(), &["a.example.com"]);
        assert_eq!(read(tmp.path(), "serving.crt"), before);
        load(tmp.path(), &["a.example.com", "2001:db8::1"]);
        assert_ne!(read(tmp.path(), "serving.crt"), before);
        assert_eq!(read(tmp.path(), "client-admin.crt"), admin_before);
    }

    #[test]
    fn corrupt_leaf_and_missing_ca_are_regenerated() {
        let tmp = tempfile::tempdir().unwrap();
        load(tmp.path(), &[]);
        let admin = read(tmp.path(), "client-admin.crt");
        let serving = read(tmp.path(), "serving.crt");
        fs::write(tmp.path().join("client-admin.crt"), "garbage").unwrap();
        load(tmp.path(), &[]);
        let fixed = read(tmp.path(), "client-admin.crt");
        assert!(fixed != admin && fixed != "garbage");
        assert_eq!(read(tmp.path(), "serving.crt"), serving);

        let ca = read(tmp.path(), "server-ca.crt");
        fs::remove_file(tmp.path().join("server-ca.key")).unwrap();
        load(tmp.path(), &[]);
        assert_ne!(read(tmp.path(), "server-ca.crt"), ca);
        assert_ne!(read(tmp.path(), "serving.crt"), serving);
        assert_ne!(read(tmp.path(), "client-admin.crt"), fixed);
    }

    #[test]
    fn rejects_invalid_tls_san() {
        let tmp = tempfile::tempdir().unwrap();
        let sans = ["bad name".to_owned()];
        let err = Pki::load_or_create(tmp.path(), "node1", &[], &sans).unwrap_err();
        assert!(matches!(err, Error::InvalidSan(_)), "{err}");
    }

    /// Runs a handshake in memory; returns the server side on success.
    fn handshake(pki: &Pki, client: ClientConfig) -> Result<ServerConnection, rustls::Error> {
        let name = ServerName::try_from("kubernetes.default.svc").unwrap();
        let mut client = Connection::from(ClientConnection::new(Arc::new(client), name)?);
        let mut server = Connection::from(ServerConnection::new(pki.server_config().unwrap())?);
        let pump = |from: &mut Connection, to: &mut Connection| -> Result<(), rustls::Error> {
            let mut buf = Vec::new();
            while from.wants_write() {
                from.write_tls(&mut buf).unwrap();
            }
            let mut data = buf.as_slice();
            while !data.is_empty() {
                to.read_tls(&mut data).unwrap();
                to.process_new_packets()?;
            }
            Ok(())
        };
        for _ in 0..10 {
            pump(&mut client, &mut server)?;
            pump(&mut server, &mut client)?;
            if !client.is_handshaking() && !server.is_handshaking() {
                let Connection::Server(server) = server else { unreachable!() };
                return Ok(server);
            }
        }
        panic!("handshake did not finish");
    }

    fn client_builder(
        pki: &Pki,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> rustls::ConfigBuilder<ClientConfig, rustls::client::WantsClientCert> {
        let mut roots = RootCertStore::empty();
        roots.add(pki.ca_der()).unwrap();
        ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
    }

    fn admin_client(pki: &Pki, signer: &Pki) -> ClientConfig {
        let (cert, key) = signer.admin_pem();
        let cert = CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
        let key = PrivatePkcs8KeyDer::from_pem_slice(key.as_bytes()).unwrap();
        let mut config =
            client_builder(pki, rustls::DEFAULT_VERSIONS).with_client_auth_cert(vec![cert], key.into()).unwrap();
        config.alpn_protocols = vec![b"h2".to_vec()];
        config
    }

    #[test]
    fn admin_client_handshake_yields_identity() {
        let tmp = tempfile::tempdir().unwrap();
        let pki = load(tmp.path(), &[]);
        let server = handshake(&pki, admin_client(&pki, &pki)).unwrap();
        assert_eq!(server.alpn_protocol(), Some(&b"h2"[..]));
        let identity = client_identity(server.peer_certificates().unwrap());
        assert_eq!(identity, Some(("system:admin".to_owned(), vec!["system:masters".to_owned()])));
    }

    #[test]
    fn anonymous_client_handshakes_over_tls12() {
        let tmp = tempfile::tempdir().unwrap();
        let pki = load(tmp.path(), &[]);
        let client = client_builder(&pki, &[&rustls::version::TLS12]).with_no_client_auth();
        let server = handshake(&pki, client).unwrap();
        assert_eq!(server.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_2));
        assert!(server.peer_certificates().is_none());
    }

    #[test]
    fn foreign_client_certificate_is_rejected() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (pki, other) = (load(a.path(), &[]), load(b.path(), &[]));
        assert!(handshake(&pki, admin_client(&pki, &other)).is_err());
    }

    #[test]
    fn kubeconfig_has_admin_credentials_and_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let pki = load(&tmp.path().join("tls"), &[]);
        let path = tmp.path().join("etc/cairn/cairn.yaml");
        let local = ("default".to_string(), "https://127.0.0.1:6443".to_string());
        write_kubeconfig(&path, 0o600, std::slice::from_ref(&local), &pki).unwrap();
        assert_eq!(mode(&path), 0o600);

        let doc: serde_yaml::Value = serde_yaml::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        let decode = |v: &serde_yaml::Value| String::from_utf8(BASE64.decode(v.as_str().unwrap()).unwrap()).unwrap();
        assert_eq!(doc["current-context"].as_str(), Some("default"));
        assert_eq!(doc["kind"].as_str(), Some("Config"));
        let cluster = &doc["clusters"][0];
        assert_eq!(cluster["name"].as_str(), Some("default"));
        assert_eq!(cluster["cluster"]["server"].as_str(), Some("https://127.0.0.1:6443"));
        assert_eq!(decode(&cluster["cluster"]["certificate-authority-data"]), pki.ca_pem());
        let context = &doc["contexts"][0];
        assert_eq!(context["name"].as_str(), Some("default"));
        assert_eq!(context["context"]["cluster"].as_str(), Some("default"));
        assert_eq!(context["context"]["user"].as_str(), Some("default"));
        let user = &doc["users"][0];
        assert_eq!(user["name"].as_str(), Some("default"));
        let (cert, key) = pki.admin_pem();
        assert_eq!(decode(&user["user"]["client-certificate-data"]), cert);
        assert_eq!(decode(&user["user"]["client-key-data"]), key);

        // Other servers of the cluster: a cluster and a context each, the same user, this one current.
        let other = ("10.0.0.5:6443".to_string(), "https://10.0.0.5:6443".to_string());
        write_kubeconfig(&path, 0o640, &[local, other], &pki).unwrap();
        assert_eq!(mode(&path), 0o640);
        let doc: serde_yaml::Value = serde_yaml::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(doc["current-context"].as_str(), Some("default"));
        assert_eq!(doc["clusters"][1]["name"].as_str(), Some("10.0.0.5:6443"));
        assert_eq!(doc["clusters"][1]["cluster"]["server"].as_str(), Some("https://10.0.0.5:6443"));
        assert_eq!(decode(&doc["clusters"][1]["cluster"]["certificate-authority-data"]), pki.ca_pem());
        assert_eq!(doc["contexts"][1]["context"]["cluster"].as_str(), Some("10.0.0.5:6443"));
        assert_eq!(doc["contexts"][1]["context"]["user"].as_str(), Some("default"));
        assert_eq!(doc["users"].as_sequence().map(Vec::len), Some(1));
    }

    #[test]
    fn join_tokens_pin_the_ca_as_k3s_tokens_do() {
        let full = JoinToken::full("ca", "s3cret");
        assert_eq!(full, format!("K10{}::server:s3cret", ca_hash("ca")));
        assert_eq!(ca_hash("ca").len(), 64);
        assert_eq!(JoinToken::parse(&full), Ok(JoinToken { ca_hash: Some(ca_hash("ca")), secret: "s3cret".into() }));
        assert_eq!(JoinToken::parse(" short\n"), Ok(JoinToken { ca_hash: None, secret: "short".into() }));
        assert!(JoinToken::parse("K10abc::server:x").unwrap_err().contains("is not a sha256"));
        assert!(JoinToken::parse(&format!("K10{}::server:", ca_hash("ca"))).unwrap_err().contains("no secret"));
        assert!(JoinToken::parse("").is_err());
    }
}
