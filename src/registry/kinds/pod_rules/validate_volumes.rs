//! Validation of volumes and their sources.

use super::*;

pub(super) const FILE_MODE_ERROR: &str = "must be a number between 0 and 0777 (octal), both inclusive";

/// `ValidateVolumes`: returns the volumes that passed, by name, for the mounts to refer to.
pub(super) fn validate_volumes<'a>(volumes: &'a [Volume], out: &mut ErrorList) -> HashMap<&'a str, &'a Volume> {
    let mut valid = HashMap::new();
    for (i, volume) in volumes.iter().enumerate() {
        let path = index("spec.volumes", i);
        let name_path = format!("{path}.name");
        let mut errs = validate_volume_source(volume, &path);
        if volume.name.is_empty() {
            errs.push(required(&name_path));
        } else {
            dns_label(&volume.name, &name_path, &mut errs);
        }
        if valid.contains_key(volume.name.as_str()) {
            errs.push(FieldError::duplicate(&name_path, &volume.name));
        }
        if errs.is_empty() {
            valid.insert(volume.name.as_str(), volume);
        }
        out.extend(errs);
    }
    valid
}

/// Exactly one source, plus the checks of the sources an edge cluster serves.
pub(super) fn validate_volume_source(v: &Volume, path: &str) -> ErrorList {
    let mut out = Vec::new();
    let sources = volume_sources(v);
    let Some(first) = sources.first() else {
        out.push(FieldError::required(path, "must specify a volume type"));
        return out;
    };
    match *first {
        "emptyDir" => {
            let size = v.empty_dir.as_ref().and_then(|e| e.size_limit.as_ref());
            if size.and_then(|q| parse_quantity(&q.0)).is_some_and(|q| q < 0) {
                out.push(FieldError::forbidden(
                    format!("{path}.emptyDir.sizeLimit"),
                    "SizeLimit field must be a valid resource quantity",
                ));
            }
        }
        "hostPath" => {
            if let Some(h) = &v.host_path {
                let field = format!("{path}.hostPath.path");
                if h.path.is_empty() {
                    out.push(required(&field));
                } else {
                    check_backsteps(&h.path, &field, &mut out);
                    let field = format!("{path}.hostPath.type");
                    check_supported(h.type_.as_deref(), &field, HOST_PATH_TYPES, &mut out);
                }
            }
        }
        "secret" => {
            if let Some(s) = &v.secret {
                let path = format!("{path}.secret");
                if opt(&s.secret_name).is_empty() {
                    out.push(required(&format!("{path}.secretName")));
                }
                check_mode(s.default_mode, &format!("{path}.defaultMode"), &mut out);
                validate_items(slice(&s.items), &path, &mut out);
            }
        }
        "configMap" => {
            if let Some(c) = &v.config_map {
                let path = format!("{path}.configMap");
                if c.name.is_empty() {
                    out.push(required(&format!("{path}.name")));
                }
                check_mode(c.default_mode, &format!("{path}.defaultMode"), &mut out);
                validate_items(slice(&c.items), &path, &mut out);
            }
        }
        "persistentVolumeClaim" if v.persistent_volume_claim.as_ref().is_some_and(|c| c.claim_name.is_empty()) => {
            out.push(required(&format!("{path}.persistentVolumeClaim.claimName")));
        }
        "nfs" => {
            if let Some(nfs) = &v.nfs {
                if nfs.server.is_empty() {
                    out.push(required(&format!("{path}.nfs.server")));
                }
                let field = format!("{path}.nfs.path");
                if nfs.path.is_empty() {
                    out.push(required(&field));
                }
                if !nfs.path.starts_with('/') {
                    out.push(FieldError::invalid(field, &nfs.path, "must be an absolute path"));
                }
            }
        }
        "downwarAPI" => {
            if let Some(d) = &v.downward_api {
                let path = format!("{path}.downwardAPI");
                check_mode(d.default_mode, &format!("{path}.defaultMode"), &mut out);
                for file in slice(&d.items) {
                    validate_downward_file(file, &path, &mut out);
                }
            }
        }
        "projected" => {
            if let Some(p) = &v.projected {
                validate_projected(p, &format!("{path}.projected"), &mut out);
            }
        }
        "image" => {
            if let Some(image) = &v.image {
                if opt(&image.reference).is_empty() {
                    out.push(required(&format!("{path}.image.reference")));
                }
                let field = format!("{path}.image.pullPolicy");
                check_enum(opt(&image.pull_policy), &field, PULL_POLICIES, &mut out);
            }
        }
        _ => {}
    }
    for extra in &sources[1..] {
        out.push(FieldError::forbidden(format!("{path}.{extra}"), "may not specify more than 1 volume type"));
    }
    out
}

pub(super) fn check_mode(mode: Option<i32>, field: &str, out: &mut ErrorList) {
    if let Some(mode) = mode
        && !(0..=0o777).contains(&mode)
    {
        out.push(invalid_raw(field, mode, FILE_MODE_ERROR));
    }
}

pub(super) fn validate_items(items: &[KeyToPath], path: &str, out: &mut ErrorList) {
    for (i, item) in items.iter().enumerate() {
        let path = format!("{path}.items[{i}]");
        if item.key.is_empty() {
            out.push(required(&format!("{path}.key")));
        }
        let path_field = format!("{path}.path");
        if item.path.is_empty() {
            out.push(required(&path_field));
        }
        local_non_reserved_path(&item.path, &path_field, out);
        check_mode(item.mode, &format!("{path}.mode"), out);
    }
}

/// Upstream reports the errors of every file on the volume's own path, without an index.
pub(super) fn validate_downward_file(file: &DownwardAPIVolumeFile, path: &str, out: &mut ErrorList) {
    let path_field = format!("{path}.path");
    if file.path.is_empty() {
        out.push(required(&path_field));
    }
    local_non_reserved_path(&file.path, &path_field, out);
    match (&file.field_ref, &file.resource_field_ref) {
        (Some(f), resource) => {
            validate_field_selector(f, VOLUME_FIELD_PATHS, &format!("{path}.fieldRef"), out);
            if resource.is_some() {
                out.push(FieldError::invalid(
                    path,
                    "resource",
                    "fieldRef and resourceFieldRef can not be specified simultaneously",
                ));
            }
        }
        (None, Some(r)) => validate_resource_selector(r, true, &format!("{path}.resourceFieldRef"), out),
        (None, None) => {
            out.push(FieldError::required(path, "one of fieldRef and resourceFieldRef is required"));
        }
    }
    check_mode(file.mode, &format!("{path}.mode"), out);
}

pub(super) fn validate_projected(projected: &ProjectedVolumeSource, path: &str, out: &mut ErrorList) {
    check_mode(projected.default_mode, &format!("{path}.defaultMode"), out);
    let mut paths = HashSet::new();
    let mut claim = |file_path: &str, value: &str, out: &mut ErrorList| {
        if !file_path.is_empty() && !paths.insert(file_path.to_string()) {
            out.push(FieldError::invalid(path, value, "conflicting duplicate paths"));
        }
    };
    for (i, source) in slice(&projected.sources).iter().enumerate() {
        let source_path = format!("{path}.sources[{i}]");
        let keyed = [
            ("secret", source.secret.as_ref().map(|s| (&s.name, slice(&s.items)))),
            ("configMap", source.config_map.as_ref().map(|c| (&c.name, slice(&c.items)))),
        ];
        for (field, keyed) in keyed {
            let Some((name, items)) = keyed else { continue };
            let path = format!("{source_path}.{field}");
            if name.is_empty() {
                out.push(required(&format!("{path}.name")));
            }
            validate_items(items, &path, out);
            for item in items {
                claim(&item.path, name, out);
            }
        }
        if let Some(d) = &source.downward_api {
            for file in slice(&d.items) {
                validate_downward_file(file, &format!("{source_path}.downwardAPI"), out);
                claim(&file.path, &file.path, out);
            }
        }
        if let Some(token) = &source.service_account_token {
            let field = format!("{source_path}.serviceAccountToken.expirationSeconds");
            let expiration = token.expiration_seconds.unwrap_or(0);
            if expiration < 600 {
                let detail = "may not specify a duration less than 10 minutes";
                out.push(invalid_raw(&field, expiration, detail));
            }
            if expiration > 1 << 32 {
                let detail = "may not specify a duration larger than 2^32 seconds";
                out.push(invalid_raw(&field, expiration, detail));
            }
            // Upstream reports the token path on the projection itself.
            if token.path.is_empty() {
                out.push(required(&format!("{path}.path")));
            } else {
                local_non_reserved_path(&token.path, &format!("{path}.path"), out);
            }
        }
        let count = [
            source.secret.is_some(),
            source.config_map.is_some(),
            source.downward_api.is_some(),
            source.service_account_token.is_some(),
            source.cluster_trust_bundle.is_some(),
            source.pod_certificate.is_some(),
        ]
        .into_iter()
        .filter(|set| *set)
        .count();
        if count > 1 {
            out.push(FieldError::forbidden(source_path, "may not specify more than 1 volume type per source"));
        }
    }
}

/// A relative path without `..` elements (`validateLocalDescendingPath`).
pub(super) fn local_descending_path(target: &str, field: &str, out: &mut ErrorList) {
    if target.starts_with('/') {
        out.push(FieldError::invalid(field, target, "must be a relative path"));
    }
    check_backsteps(target, field, out);
}

/// `ValidateLocalNonReservedPath`: also rejects names starting with `..`.
pub(super) fn local_non_reserved_path(target: &str, field: &str, out: &mut ErrorList) {
    local_descending_path(target, field, out);
    if target.starts_with("..") && !target.starts_with("../") {
        out.push(FieldError::invalid(field, target, "must not start with '..'"));
    }
}

pub(super) fn has_backsteps(target: &str) -> bool {
    target.split('/').any(|part| part == "..")
}

pub(super) fn check_backsteps(target: &str, field: &str, out: &mut ErrorList) {
    if has_backsteps(target) {
        out.push(FieldError::invalid(field, target, "must not contain '..'"));
    }
}
