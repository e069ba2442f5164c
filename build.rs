//! Build steps, one function per job.

fn main() {
    protobuf_table::generate();
    pause::build();
    grpc::generate();
}

/// gRPC bindings of the plugin APIs cairn serves and calls: CSI (`proto/csi.proto`), kubelet's plugin
/// registration (`proto/pluginregistration.proto`), device plugins and pod resources. protoc is the `protoc-bin-vendored` crate's, so the
/// build needs no protobuf compiler installed; a system one serves where that crate has no binary.
mod grpc {
    pub fn generate() {
        const PROTOS: &[&str] = &[
            "proto/csi.proto",
            "proto/pluginregistration.proto",
            "proto/deviceplugin.proto",
            "proto/podresources.proto",
        ];
        for p in PROTOS {
            println!("cargo:rerun-if-changed={p}");
        }
        let mut config = prost_build::Config::new();
        config.protoc_executable(protoc_bin_vendored::protoc_bin_path().unwrap_or_else(|_| "protoc".into()));
        tonic_prost_build::configure()
            .compile_with_config(config, PROTOS, &["proto"])
            .unwrap_or_else(|e| panic!("generating the gRPC bindings of proto/: {e}"));
    }
}

/// Compiles `embedded/pause.c` into a static `$OUT_DIR/pause`, the process of cairn's built-in sandbox
/// image, with the C compiler for the target (so cross builds get a matching binary).
mod pause {
    use std::path::PathBuf;

    pub fn build() {
        let source = "embedded/pause.c";
        println!("cargo:rerun-if-changed={source}");
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("pause");
        let compiler = cc::Build::new().cargo_metadata(false).opt_level_str("s").get_compiler();
        let status = compiler
            .to_command()
            .args(["-static", "-Os", "-s", "-Wl,--gc-sections", "-o"])
            .arg(&out)
            .arg(source)
            .status()
            .expect("running the C compiler for embedded/pause.c");
        assert!(
            status.success(),
            "compiling embedded/pause.c failed: a C compiler with a static libc is needed (Debian: gcc, libc6-dev)"
        );
    }
}

/// Generates `$OUT_DIR/protobuf_table.rs`, the field table `src/api/protobuf.rs` decodes Kubernetes
/// protobuf with.
///
/// Field numbers and wire types come from the prost bindings in the `k8s-pb` crate's source; JSON
/// names come from `k8s-openapi`'s source, matched to prost's snake_case names within each type by
/// comparing them lowercased without underscores. A field that cannot be matched fails the build.
mod protobuf_table {
    use std::collections::{BTreeMap, HashMap};
    use std::fmt::Write as _;
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::{env, fs};

    use proc_macro2::{TokenStream, TokenTree};
    use syn::punctuated::Punctuated;
    use syn::{Expr, GenericArgument, Lit, Meta, PathArguments, Token, Type};

    /// Modules whose kinds (as listed by k8s-openapi) a body may hold.
    const KIND_MODULES: &[&str] = &[
        "api::core::v1",
        "api::coordination::v1",
        "api::events::v1",
        "api::authentication::v1",
        "api::authorization::v1",
        "api::certificates::v1",
        "api::policy::v1",
        "api::rbac::v1",
        "api::storage::v1",
        "api::node::v1",
        "api::apps::v1",
        "api::autoscaling::v1",
        "api::autoscaling::v2",
        "api::batch::v1",
        "api::discovery::v1",
        "api::networking::v1",
    ];
    /// Kinds of those modules that cairn does not serve and `k8s-pb` does not have yet.
    const UNSERVED_KINDS: &[&str] =
        &["api::certificates::v1::ClusterTrustBundle", "api::certificates::v1::PodCertificateRequest"];
    /// Kinds accepted under any apiVersion, as clients send them with the group version of the request.
    const ANY_VERSION_KINDS: &[&str] = &["apimachinery::pkg::apis::meta::v1::DeleteOptions"];

    const UNKNOWN: &str = "apimachinery::pkg::runtime::Unknown";
    const TYPE_META: &str = "apimachinery::pkg::runtime::TypeMeta";

    pub fn generate() {
        println!("cargo::rerun-if-changed=build.rs");
        println!("cargo::rerun-if-changed=Cargo.lock");
        let (pb_dir, openapi_dir) = locate_sources();
        let mut generator = Generator {
            pb: Pb { src: pb_dir.join("src"), modules: HashMap::new() },
            api: OpenApi { src: openapi_dir, files: HashMap::new(), types: HashMap::new() },
            messages: Vec::new(),
            index: HashMap::new(),
            errors: Vec::new(),
            skipped: Vec::new(),
        };
        let code = generator.run();
        if !generator.errors.is_empty() {
            panic!("cannot build the protobuf field table:\n  {}", generator.errors.join("\n  "));
        }
        let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("protobuf_table.rs");
        fs::write(&out, code).unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    }

    /// Finds the source directories of `k8s-pb` and of the enabled version of `k8s-openapi` with `cargo metadata`.
    ///
    /// Metadata lists every package of the lock file, dev-dependencies included, which a plain `cargo build` on
    /// a fresh machine has not downloaded: then it runs again without `--offline`, to fetch them.
    fn locate_sources() -> (PathBuf, PathBuf) {
        let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let metadata = |offline: bool| {
            let mut cmd = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            cmd.args(["metadata", "--format-version", "1", "--locked", "--manifest-path"]).arg(&manifest);
            if let Ok(target) = env::var("TARGET") {
                cmd.args(["--filter-platform", &target]);
            }
            if offline {
                cmd.arg("--offline");
            }
            let output = cmd.output().unwrap_or_else(|e| panic!("running cargo metadata: {e}"));
            if output.status.success() {
                Ok(output.stdout)
            } else {
                Err(String::from_utf8_lossy(&output.stderr).into_owned())
            }
        };
        let stdout = metadata(true).or_else(|_| metadata(false)).unwrap_or_else(|e| {
            panic!("cargo metadata failed (`cargo fetch` downloads what it needs): {e}");
        });
        let meta: serde_json::Value = serde_json::from_slice(&stdout).expect("cargo metadata prints JSON");
        let str_of = |v: &serde_json::Value, key: &str| v[key].as_str().unwrap_or_default().to_string();
        let packages = meta["packages"].as_array().cloned().unwrap_or_default();
        let manifest = manifest.canonicalize().unwrap_or(manifest);
        let this = packages
            .iter()
            .find(|p| Path::new(p["manifest_path"].as_str().unwrap_or_default()) == manifest)
            .map(|p| str_of(p, "id"))
            .expect("cargo metadata lists this package");
        let nodes = meta["resolve"]["nodes"].as_array().cloned().unwrap_or_default();
        let node = |id: &str| nodes.iter().find(|n| n["id"] == id).cloned().unwrap_or_default();
        let deps = node(&this)["deps"].as_array().cloned().unwrap_or_default();
        let dep = |name: &str| -> (PathBuf, serde_json::Value) {
            let id = deps
                .iter()
                .map(|d| str_of(d, "pkg"))
                .find(|id| packages.iter().any(|p| p["id"] == id.as_str() && p["name"] == name))
                .unwrap_or_else(|| panic!("{name} must be a dependency of this package"));
            let package = packages.iter().find(|p| p["id"] == id.as_str()).expect("listed package");
            let dir =
                PathBuf::from(str_of(package, "manifest_path")).parent().expect("manifest directory").to_path_buf();
            (dir, node(&id))
        };
        let (pb_dir, _) = dep("k8s-pb");
        let (openapi_dir, openapi) = dep("k8s-openapi");
        let versions: Vec<String> = openapi["features"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f.as_str())
            .filter(|f| f.starts_with("v1_"))
            .map(String::from)
            .collect();
        let [version] = versions.as_slice() else {
            panic!("expected one k8s-openapi version feature, found {versions:?}");
        };
        (pb_dir, openapi_dir.join("src").join(version))
    }

    /// A protobuf scalar type as prost names it, or a message.
    #[derive(Clone, Debug)]
    enum PbType {
        Scalar(String),
        Message(String),
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Card {
        Single,
        Repeated,
        Map,
    }

    #[derive(Clone, Debug)]
    struct PbField {
        name: String,
        /// Marked `+featureGate=`: an alpha or beta field that an API version may lack.
        gated: bool,
        number: u32,
        ty: Result<PbType, String>,
        card: Card,
    }

    #[derive(Clone, Debug)]
    struct PbMessage {
        name: String,
        /// `+protobuf.nullable=true`: a Go slice type wrapped in a message with a single `items` field.
        nullable: bool,
        fields: Vec<PbField>,
    }

    /// The prost bindings of `k8s-pb`, parsed one module at a time.
    struct Pb {
        src: PathBuf,
        modules: HashMap<String, HashMap<String, PbMessage>>,
    }

    impl Pb {
        /// The message at `path` (e.g. `api::core::v1::Pod`).
        fn message(&mut self, path: &str) -> Option<PbMessage> {
            let (module, name) = path.rsplit_once("::")?;
            self.module(module).get(name).cloned()
        }

        /// Finds a message of `module` by normalized name; returns its full path.
        fn find(&mut self, module: &str, name: &str) -> Option<String> {
            let key = normalize(name);
            self.module(module).keys().find(|n| normalize(n) == key).map(|n| format!("{module}::{n}"))
        }

        fn module(&mut self, module: &str) -> &HashMap<String, PbMessage> {
            if !self.modules.contains_key(module) {
                let messages = self.parse_module(module);
                self.modules.insert(module.to_string(), messages);
            }
            &self.modules[module]
        }

        fn parse_module(&self, module: &str) -> HashMap<String, PbMessage> {
            let dir = self.src.join(module.replace("::", "/"));
            let file = [dir.join("mod.rs"), dir.with_extension("rs")].into_iter().find(|f| f.exists());
            let Some(file) = file else { return HashMap::new() };
            let text = fs::read_to_string(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
            let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", file.display()));
            let mut messages = HashMap::new();
            for item in ast.items {
                let syn::Item::Struct(s) = item else { continue };
                if !s.attrs.iter().any(derives_message) {
                    continue;
                }
                let nullable = s.attrs.iter().any(|a| doc(a).is_some_and(|d| d.contains("+protobuf.nullable=true")));
                let fields = s.fields.iter().filter_map(|f| pb_field(module, f)).collect();
                let name = s.ident.to_string();
                messages.insert(name.clone(), PbMessage { name, nullable, fields });
            }
            messages
        }
    }

    fn derives_message(attr: &syn::Attribute) -> bool {
        attr.path().is_ident("derive")
            && attr
                .parse_args_with(Punctuated::<syn::Path, Token![,]>::parse_terminated)
                .is_ok_and(|paths| paths.iter().any(|p| p.segments.last().is_some_and(|s| s.ident == "Message")))
    }

    fn doc(attr: &syn::Attribute) -> Option<String> {
        match &attr.meta {
            Meta::NameValue(nv) if nv.path.is_ident("doc") => match &nv.value {
                Expr::Lit(syn::ExprLit { lit: Lit::Str(s), .. }) => Some(s.value()),
                _ => None,
            },
            _ => None,
        }
    }

    /// Reads a field's `#[prost(...)]` attribute.
    fn pb_field(module: &str, field: &syn::Field) -> Option<PbField> {
        let attr = field.attrs.iter().find(|a| a.path().is_ident("prost"))?;
        let name = field.ident.as_ref()?.to_string().trim_start_matches("r#").to_string();
        let metas = attr.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated).ok()?;
        let (mut number, mut card, mut ty) = (0, Card::Single, Err(format!("no type in {}", name)));
        for meta in &metas {
            let key = meta.path().get_ident().map(|i| i.to_string()).unwrap_or_default();
            let value = match meta {
                Meta::NameValue(syn::MetaNameValue {
                    value: Expr::Lit(syn::ExprLit { lit: Lit::Str(s), .. }), ..
                }) => Some(s.value()),
                _ => None,
            };
            match (key.as_str(), value) {
                ("tag", Some(v)) => number = v.parse().unwrap_or(0),
                ("optional" | "required" | "boxed" | "packed", _) => {}
                ("repeated", None) => card = Card::Repeated,
                ("message", None) => ty = message_type(module, &field.ty).map(PbType::Message),
                ("string" | "bool" | "int32" | "int64" | "double" | "float", None) => ty = Ok(PbType::Scalar(key)),
                ("bytes", _) => ty = Ok(PbType::Scalar(key)),
                ("btree_map" | "hash_map", Some(v)) => {
                    card = Card::Map;
                    ty = match v.split_once(',').map(|(k, v)| (k.trim(), v.trim())) {
                        Some(("string", "message")) => message_type(module, &field.ty).map(PbType::Message),
                        Some(("string", scalar)) => Ok(PbType::Scalar(scalar.to_string())),
                        _ => Err(format!("map {v:?} with non-string keys")),
                    };
                }
                (other, _) => ty = Err(format!("unsupported prost attribute `{other}`")),
            }
        }
        let gated = field.attrs.iter().any(|a| doc(a).is_some_and(|d| d.contains("+featureGate=")));
        Some(PbField { name, gated, number, ty, card })
    }

    /// Resolves the message type inside a field's `Option`/`Vec`/`Box`/map type to a full path.
    fn message_type(module: &str, ty: &Type) -> Result<String, String> {
        let Type::Path(p) = ty else { return Err("a field type that is not a path".into()) };
        let last = p.path.segments.last().ok_or("an empty type path")?;
        if ["Option", "Vec", "Box", "BTreeMap", "HashMap"].contains(&last.ident.to_string().as_str()) {
            let PathArguments::AngleBracketed(args) = &last.arguments else { return Err("a bare container".into()) };
            return match args.args.last() {
                Some(GenericArgument::Type(inner)) => message_type(module, inner),
                _ => Err("a container without a type argument".into()),
            };
        }
        let mut path: Vec<String> = module.split("::").map(String::from).collect();
        for seg in &p.path.segments {
            match seg.ident.to_string().as_str() {
                "super" => drop(path.pop()),
                "crate" => path.clear(),
                name => path.push(name.to_string()),
            }
        }
        Ok(path.join("::"))
    }

    /// One k8s-openapi type: its name, its JSON field names and, for a kind, its apiVersion and kind.
    #[derive(Clone, Default)]
    struct ApiType {
        name: String,
        json: Vec<String>,
        resource: Option<(String, String)>,
    }

    /// The enabled version of `k8s-openapi`'s source, scanned one file at a time.
    struct OpenApi {
        src: PathBuf,
        files: HashMap<String, Vec<PathBuf>>,
        types: HashMap<PathBuf, Option<ApiType>>,
    }

    impl OpenApi {
        /// The type for the message at `path`, matched by module and normalized name.
        fn get(&mut self, path: &str) -> Option<ApiType> {
            let (module, name) = path.rsplit_once("::")?;
            let key = normalize(name);
            let file = self
                .files(module)
                .into_iter()
                .find(|f| f.file_stem().is_some_and(|s| normalize(&s.to_string_lossy()) == key))?;
            self.scan(&file)
        }

        /// The kinds defined in `module`.
        fn kinds(&mut self, module: &str) -> Vec<ApiType> {
            let files = self.files(module);
            files
                .iter()
                .filter(|f| fs::read_to_string(f).is_ok_and(|t| t.contains("impl crate::Resource for")))
                .filter_map(|f| self.scan(f))
                .filter(|t| t.resource.is_some())
                .collect()
        }

        /// The source files of `module`, one per type.
        fn files(&mut self, module: &str) -> Vec<PathBuf> {
            let dir = self.src.join(module.replace("::", "/"));
            let files = self.files.entry(module.to_string()).or_insert_with(|| {
                let mut files: Vec<PathBuf> = fs::read_dir(&dir)
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|e| e == "rs") && !p.ends_with("mod.rs"))
                    .collect();
                files.sort();
                files
            });
            files.clone()
        }

        /// Reads the type's name, the `"jsonName" => Field::Key_...` arms of its Deserialize impl and
        /// the constants of its `Resource` impl from the file's tokens.
        fn scan(&mut self, file: &Path) -> Option<ApiType> {
            if let Some(t) = self.types.get(file) {
                return t.clone();
            }
            let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
            let tokens: TokenStream = text.parse().unwrap_or_else(|e| panic!("lexing {}: {e:?}", file.display()));
            let mut flat = Vec::new();
            flatten(tokens, &mut flat);
            let ident = |i: usize| match flat.get(i) {
                Some(TokenTree::Ident(id)) => id.to_string(),
                _ => String::new(),
            };
            let punct = |i: usize, c: char| matches!(flat.get(i), Some(TokenTree::Punct(p)) if p.as_char() == c);
            let string = |i: usize| match flat.get(i) {
                Some(TokenTree::Literal(l)) => match Lit::new(l.clone()) {
                    Lit::Str(s) => Some(s.value()),
                    _ => None,
                },
                _ => None,
            };
            let after = |from: usize, name: &str| {
                (from..flat.len()).find(|&i| ident(i) == name).and_then(|i| (i..flat.len()).find_map(string))
            };
            let mut ty = ApiType::default();
            for i in 0..flat.len() {
                if ty.name.is_empty() && ident(i) == "pub" && ["struct", "enum"].contains(&ident(i + 1).as_str()) {
                    ty.name = ident(i + 2);
                }
                if punct(i + 1, '=') && punct(i + 2, '>') && ident(i + 3) == "Field" && ident(i + 6).starts_with("Key_")
                {
                    ty.json.extend(string(i));
                }
                if ident(i) == "Resource" && ident(i + 1) == "for" {
                    ty.resource = after(i, "API_VERSION").zip(after(i, "KIND"));
                }
            }
            let ty = (!ty.name.is_empty()).then_some(ty);
            self.types.insert(file.to_path_buf(), ty.clone());
            ty
        }
    }

    fn flatten(tokens: TokenStream, out: &mut Vec<TokenTree>) {
        for tt in tokens {
            match tt {
                TokenTree::Group(g) => flatten(g.stream(), out),
                tt => out.push(tt),
            }
        }
    }

    /// Lowercase without underscores: `pod_i_ps` and `podIPs` both become `podips`.
    fn normalize(name: &str) -> String {
        name.chars().filter(char::is_ascii_alphanumeric).map(|c| c.to_ascii_lowercase()).collect()
    }

    /// `api::core::v1` → `core/v1`, `apimachinery::pkg::runtime` → `runtime`.
    fn display_module(module: &str) -> String {
        let segs: Vec<&str> = module.split("::").collect();
        match segs.as_slice() {
            [.., group, version]
                if version.starts_with('v') && version[1..].starts_with(|c: char| c.is_ascii_digit()) =>
            {
                format!("{group}/{version}")
            }
            [.., last] => last.to_string(),
            [] => String::new(),
        }
    }

    struct Generator {
        pb: Pb,
        api: OpenApi,
        /// Rust expressions of the table's messages, by index.
        messages: Vec<String>,
        /// (message path, path of the type whose JSON names it uses) → index.
        index: HashMap<(String, String), usize>,
        errors: Vec<String>,
        /// Feature-gated fields the enabled API version lacks.
        skipped: Vec<String>,
    }

    impl Generator {
        fn run(&mut self) -> String {
            let mut kinds = Vec::new();
            for module in KIND_MODULES {
                for ty in self.api.kinds(module) {
                    if UNSERVED_KINDS.contains(&format!("{module}::{}", ty.name).as_str()) {
                        continue;
                    }
                    let (api_version, kind) = ty.resource.clone().unwrap_or_default();
                    match self.pb.find(module, &ty.name) {
                        Some(path) => {
                            let index = self.message(&path, &path);
                            kinds.push(format!(
                                "Kind {{ api_version: Some({api_version:?}), kind: {kind:?}, message: {index} }},"
                            ));
                        }
                        None => self.errors.push(format!("k8s-pb has no message for {module}::{}", ty.name)),
                    }
                }
            }
            for path in ANY_VERSION_KINDS {
                let index = self.message(path, path);
                let kind = path.rsplit("::").next().unwrap_or_default();
                kinds.push(format!("Kind {{ api_version: None, kind: {kind:?}, message: {index} }},"));
            }
            let envelope: Vec<String> = [
                (UNKNOWN, "type_meta", "message"),
                (UNKNOWN, "raw", "bytes"),
                (UNKNOWN, "content_encoding", "string"),
                (UNKNOWN, "content_type", "string"),
                (TYPE_META, "api_version", "string"),
                (TYPE_META, "kind", "string"),
            ]
            .into_iter()
            .map(|(path, field, ty)| format!("{field}: {}", self.number(path, field, ty)))
            .collect();
            let mut code = String::from("// Generated by build.rs from the k8s-pb and k8s-openapi crates.\n\n");
            for skipped in &self.skipped {
                writeln!(code, "// Skipped (feature-gated, not in this API version): {skipped}").ok();
            }
            writeln!(code, "pub(super) static MESSAGES: &[Message] = &[").ok();
            for (i, m) in self.messages.iter().enumerate() {
                writeln!(code, "    /* {i} */ {m},").ok();
            }
            writeln!(code, "];\n\npub(super) static KINDS: &[Kind] = &[").ok();
            for k in &kinds {
                writeln!(code, "    {k}").ok();
            }
            writeln!(code, "];\n\npub(super) const ENVELOPE: Envelope = Envelope {{ {} }};", envelope.join(", ")).ok();
            if self.messages.len() > usize::from(u16::MAX) {
                self.errors.push("more messages than a u16 indexes".into());
            }
            code
        }

        /// The number of field `field` of message `path`, checked to have prost type `ty`.
        fn number(&mut self, path: &str, field: &str, ty: &str) -> u32 {
            let found = self.pb.message(path).and_then(|m| m.fields.into_iter().find(|f| f.name == field));
            match found {
                Some(PbField { number, ty: Ok(PbType::Scalar(t)), card: Card::Single, .. }) if t == ty => number,
                Some(PbField { number, ty: Ok(PbType::Message(_)), card: Card::Single, .. }) if ty == "message" => {
                    number
                }
                _ => {
                    self.errors.push(format!("k8s-pb's {path} has no single {ty} field `{field}`"));
                    0
                }
            }
        }

        /// The table index of message `path` with JSON names from the k8s-openapi type of `names`,
        /// adding it (and what it refers to) on first use.
        fn message(&mut self, path: &str, names: &str) -> usize {
            let key = (path.to_string(), names.to_string());
            if let Some(&i) = self.index.get(&key) {
                return i;
            }
            let i = self.messages.len();
            self.index.insert(key, i);
            self.messages.push(String::new());
            let Some(message) = self.pb.message(path) else {
                self.errors.push(format!("k8s-pb has no message {path}"));
                return i;
            };
            let (module, _) = path.rsplit_once("::").unwrap_or_default();
            let api = self.api.get(names);
            let own = if path == names { api.as_ref().map(|a| a.name.clone()) } else { None };
            let display = format!("{} {}", display_module(module), own.unwrap_or_else(|| message.name.clone()));
            let shape = match self.special(path, &message) {
                Some(shape) => shape,
                None => self.object(path, &message, names, api),
            };
            self.messages[i] = format!("Message {{ name: {display:?}, shape: {shape} }}");
            i
        }

        /// The JSON name of `field` in `api`, or `None` for a message embedded into it.
        fn json_name(&mut self, api: &ApiType, field: &PbField, ty: &PbType) -> Result<Option<String>, String> {
            let matches: Vec<&String> = api.json.iter().filter(|j| normalize(j) == normalize(&field.name)).collect();
            match (matches.as_slice(), ty) {
                ([json], _) => Ok(Some(json.to_string())),
                ([], PbType::Message(inner)) if field.card == Card::Single && self.embeds(inner, api) => Ok(None),
                ([], _) => Err(format!("k8s-openapi's {} has no such field", api.name)),
                _ => Err(format!("k8s-openapi's {} has several fields that match: {matches:?}", api.name)),
            }
        }

        /// Whether every field of message `path` has a JSON name in `api` (Go's `json:",inline"`).
        fn embeds(&mut self, path: &str, api: &ApiType) -> bool {
            let Some(message) = self.pb.message(path) else { return false };
            message.fields.iter().all(|f| match &f.ty {
                Ok(ty) => self.json_name(api, f, ty).is_ok(),
                Err(_) => false,
            })
        }

        /// The shape of a type whose JSON form is not an object of its fields.
        fn special(&mut self, path: &str, message: &PbMessage) -> Option<String> {
            let name = path.strip_prefix("apimachinery::pkg::").unwrap_or_default();
            Some(match name {
                "apis::meta::v1::Time" | "apis::meta::v1::MicroTime" => format!(
                    "Shape::Time {{ seconds: {}, nanos: {}, micros: {} }}",
                    self.number(path, "seconds", "int64"),
                    self.number(path, "nanos", "int32"),
                    name.ends_with("MicroTime")
                ),
                "apis::meta::v1::Duration" => {
                    format!("Shape::Duration {{ nanos: {} }}", self.number(path, "duration", "int64"))
                }
                "api::resource::Quantity" | "api::resource::QuantityValue" => {
                    format!("Shape::Quantity {{ string: {} }}", self.number(path, "string", "string"))
                }
                "util::intstr::IntOrString" => format!(
                    "Shape::IntOrString {{ kind: {}, int: {}, string: {} }}",
                    self.number(path, "type", "int64"),
                    self.number(path, "int_val", "int32"),
                    self.number(path, "str_val", "string")
                ),
                "runtime::RawExtension" | "apis::meta::v1::FieldsV1" => {
                    format!("Shape::RawJson {{ raw: {} }}", self.number(path, "raw", "bytes"))
                }
                _ if message.nullable => match message.fields.as_slice() {
                    [PbField { number, ty: Ok(PbType::Scalar(t)), card: Card::Repeated, .. }] if t == "string" => {
                        format!("Shape::List {{ items: {number} }}")
                    }
                    _ => {
                        self.errors.push(format!("{path} is nullable but not a single list of strings"));
                        String::new()
                    }
                },
                _ => return None,
            })
        }

        /// An object whose fields take their JSON names from `api`, the k8s-openapi type of `names`.
        /// A message field without a JSON name whose own fields all have one is embedded (Go's
        /// `json:",inline"`): its fields join this object. A feature-gated field that the type lacks
        /// is left out, as the API version does not have it; any other unmatched field is an error.
        fn object(&mut self, path: &str, message: &PbMessage, names: &str, api: Option<ApiType>) -> String {
            let Some(api) = api else {
                self.errors.push(format!("k8s-openapi has no type for {path}"));
                return String::new();
            };
            let mut fields = BTreeMap::new();
            for field in &message.fields {
                let ty = match &field.ty {
                    Ok(ty) => ty.clone(),
                    Err(e) => {
                        self.errors.push(format!("{path}.{}: {e}", field.name));
                        continue;
                    }
                };
                let (json, card) = match self.json_name(&api, field, &ty) {
                    Ok(Some(json)) => (json, field.card),
                    Ok(None) => (String::new(), Card::Single),
                    Err(e) if field.gated => {
                        self.skipped.push(format!("{path}.{}: {e}", field.name));
                        continue;
                    }
                    Err(e) => {
                        self.errors.push(format!("{path}.{}: {e}", field.name));
                        continue;
                    }
                };
                let json = json.as_str();
                let ty = match &ty {
                    PbType::Message(inner) if json.is_empty() => format!("Ty::Message({})", self.message(inner, names)),
                    PbType::Message(inner) => format!("Ty::Message({})", self.message(inner, inner)),
                    PbType::Scalar(s) => match s.as_str() {
                        "string" => "Ty::Str".into(),
                        "bytes" => "Ty::Bytes".into(),
                        "bool" => "Ty::Bool".into(),
                        "int32" => "Ty::Int32".into(),
                        "int64" => "Ty::Int64".into(),
                        "double" => "Ty::Double".into(),
                        other => {
                            self.errors.push(format!("{path}.{}: unsupported scalar type {other}", field.name));
                            continue;
                        }
                    },
                };
                let card = match (json.is_empty(), card) {
                    (true, _) => "Inline",
                    (false, Card::Single) => "Single",
                    (false, Card::Repeated) => "Repeated",
                    (false, Card::Map) => "Map",
                };
                if fields
                    .insert(
                        field.number,
                        format!("Field {{ number: {}, json: {json:?}, ty: {ty}, card: Card::{card} }}", field.number),
                    )
                    .is_some()
                {
                    self.errors.push(format!("{path}: field number {} appears twice", field.number));
                }
            }
            let fields: Vec<String> = fields.into_values().collect();
            format!("Shape::Object(&[{}])", fields.join(", "))
        }
    }
}
