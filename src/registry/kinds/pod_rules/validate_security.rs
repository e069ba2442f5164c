//! Validation of pod and container security contexts, sysctls, seccomp and AppArmor.

use super::*;

pub(super) const SYSCTL_REGEX: &str = r"^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$";

pub(super) fn validate_pod_security_context(spec: &PodSpec, out: &mut ErrorList) {
    let path = "spec.securityContext";
    let sc = spec.security_context.as_ref();
    if let Some(sc) = sc {
        for (id, field) in [(sc.fs_group, "fsGroup"), (sc.run_as_user, "runAsUser"), (sc.run_as_group, "runAsGroup")] {
            check_id(id, &format!("{path}.{field}"), out);
        }
        for (i, gid) in slice(&sc.supplemental_groups).iter().enumerate() {
            check_id(Some(*gid), &format!("{path}.supplementalGroups[{i}]"), out);
        }
    }
    if spec.share_process_namespace == Some(true) && spec.host_pid == Some(true) {
        out.push(invalid_raw(
            &format!("{path}.shareProcessNamespace"),
            true,
            "ShareProcessNamespace and HostPID cannot both be enabled",
        ));
    }
    let Some(sc) = sc else { return };
    let mut names = HashSet::new();
    for (i, sysctl) in slice(&sc.sysctls).iter().enumerate() {
        let field = format!("{path}.sysctls[{i}].name");
        let name = sysctl.name.as_str();
        if name.is_empty() {
            out.push(required(&field));
        } else if !valid_sysctl_name(name) {
            let detail = format!("must have at most 253 characters and match regex {SYSCTL_REGEX}");
            out.push(FieldError::invalid(field, name, detail));
        } else if names.contains(name) {
            out.push(FieldError::duplicate(field, name));
        }
        names.insert(name);
    }
    let policy = sc.fs_group_change_policy.as_deref();
    check_supported(policy, &format!("{path}.fsGroupChangePolicy"), FS_GROUP_CHANGE_POLICIES, out);
    validate_seccomp(sc.seccomp_profile.as_ref(), &format!("{path}.seccompProfile"), out);
    validate_app_armor(sc.app_armor_profile.as_ref(), &format!("{path}.appArmorProfile"), out);
    let policy = sc.supplemental_groups_policy.as_deref();
    let field = format!("{path}.supplementalGroupsPolicy");
    check_supported(policy, &field, SUPPLEMENTAL_GROUPS_POLICIES, out);
    let policy = sc.se_linux_change_policy.as_deref();
    check_supported(policy, &format!("{path}.seLinuxChangePolicy"), SELINUX_CHANGE_POLICIES, out);
}

pub(super) fn valid_sysctl_name(name: &str) -> bool {
    let segment = |s: &str| {
        let b = s.as_bytes();
        let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        b.first().is_some_and(edge)
            && b.last().is_some_and(edge)
            && b.iter().all(|c| edge(c) || *c == b'-' || *c == b'_')
    };
    name.len() <= 253 && name.split(['.', '/']).all(segment)
}

/// User and group IDs are 0..=2^31-1.
pub(super) fn check_id(id: Option<i64>, field: &str, out: &mut ErrorList) {
    if let Some(id) = id
        && !(0..=MAX_INT32).contains(&id)
    {
        out.push(invalid_raw(field, id, &range_error(0, MAX_INT32)));
    }
}

pub(super) fn validate_security_context(sc: &SecurityContext, path: &str, host_users: bool, out: &mut ErrorList) {
    check_id(sc.run_as_user, &format!("{path}.runAsUser"), out);
    check_id(sc.run_as_group, &format!("{path}.runAsGroup"), out);
    if let Some(proc_mount) = &sc.proc_mount {
        let field = format!("{path}.procMount");
        check_supported(Some(proc_mount.as_str()), &field, PROC_MOUNT_TYPES, out);
        if host_users && proc_mount == "Unmasked" {
            let detail = "`hostUsers` must be false to use `Unmasked`";
            out.push(FieldError::invalid(field, proc_mount, detail));
        }
    }
    validate_seccomp(sc.seccomp_profile.as_ref(), &format!("{path}.seccompProfile"), out);
    if sc.allow_privilege_escalation == Some(false) {
        if sc.privileged == Some(true) {
            let detail = "cannot set `allowPrivilegeEscalation` to false and `privileged` to true";
            out.push(invalid_json(path, sc, detail));
        }
        let added = sc.capabilities.as_ref().map(|c| slice(&c.add)).unwrap_or_default();
        for _ in added.iter().filter(|c| *c == "CAP_SYS_ADMIN") {
            let detail = "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN";
            out.push(invalid_json(path, sc, detail));
        }
    }
    validate_app_armor(sc.app_armor_profile.as_ref(), &format!("{path}.appArmorProfile"), out);
}

pub(super) fn validate_seccomp(profile: Option<&SeccompProfile>, path: &str, out: &mut ErrorList) {
    let Some(profile) = profile else { return };
    let (kind, local) = (profile.type_.as_str(), profile.localhost_profile.as_deref());
    let type_path = format!("{path}.type");
    if kind.is_empty() {
        out.push(FieldError::required(type_path, "type is required when seccompProfile is set"));
    } else {
        check_supported(Some(kind), &type_path, PROFILE_TYPES, out);
    }
    let local_path = format!("{path}.localhostProfile");
    match local {
        None if kind == "Localhost" => {
            out.push(FieldError::required(local_path, "must be set when seccomp type is Localhost"))
        }
        Some(local) if kind == "Localhost" => local_descending_path(local, &local_path, out),
        Some(_) => out.push(invalid_json(&local_path, profile, "can only be set when seccomp type is Localhost")),
        None => {}
    }
}

pub(super) fn validate_app_armor(profile: Option<&AppArmorProfile>, path: &str, out: &mut ErrorList) {
    let Some(profile) = profile else { return };
    let local_path = format!("{path}.localhostProfile");
    let local = profile.localhost_profile.as_deref();
    match profile.type_.as_str() {
        "Localhost" => {
            let missing = "must be set when AppArmor type is Localhost";
            match local {
                None => out.push(FieldError::required(&local_path, missing)),
                Some(p) if p.trim() != p => {
                    out.push(FieldError::invalid(&local_path, p, "must not be padded with whitespace"))
                }
                Some("") => out.push(FieldError::required(&local_path, missing)),
                Some(_) => {}
            }
            if local.is_some_and(|p| p.len() > 4095) {
                out.push(FieldError::too_long(local_path, 4095));
            }
        }
        "RuntimeDefault" | "Unconfined" => {
            if let Some(local) = local {
                let detail = "can only be set when AppArmor type is Localhost";
                out.push(FieldError::invalid(local_path, local, detail));
            }
        }
        "" => out.push(FieldError::required(format!("{path}.type"), "type is required when appArmorProfile is set")),
        other => out.push(FieldError::not_supported(format!("{path}.type"), other, PROFILE_TYPES)),
    }
}
