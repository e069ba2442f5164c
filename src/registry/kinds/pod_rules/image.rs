//! Image references: the default pull policy by tag, and the reference grammar validation checks.

/// `Always` for `:latest` or untagged images, `IfNotPresent` otherwise (a digest counts as a tag).
pub(super) fn default_pull_policy(image: &str) -> &'static str {
    if image_tag(image) == Some("latest") { "Always" } else { "IfNotPresent" }
}

/// The tag an image reference names: `latest` when it has neither tag nor digest, `""` when it
/// only has a digest, `None` when the reference does not parse.
pub(super) fn image_tag(image: &str) -> Option<&str> {
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (image, None),
    };
    if digest.is_some_and(|d| !valid_digest(d)) {
        return None;
    }
    let last = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last..].rfind(':') {
        Some(i) => (&rest[..last + i], Some(&rest[last + i + 1..])),
        None => (rest, None),
    };
    if tag.is_some_and(|t| !valid_tag(t)) || !valid_repository(name) {
        return None;
    }
    match (tag, digest) {
        (Some(t), _) => Some(t),
        (None, None) => Some("latest"),
        (None, Some(_)) => Some(""),
    }
}

pub(super) fn valid_digest(d: &str) -> bool {
    let Some((alg, hex)) = d.split_once(':') else {
        return false;
    };
    let len = match alg {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return false,
    };
    hex.len() == len && hex.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

pub(super) fn valid_tag(t: &str) -> bool {
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    !t.is_empty() && t.len() <= 128 && word(t.as_bytes()[0]) && t.bytes().all(|c| word(c) || c == b'.' || c == b'-')
}

pub(super) fn valid_repository(name: &str) -> bool {
    if name.is_empty() || name.len() > 255 {
        return false;
    }
    if name.len() == 64 && name.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)) {
        return false;
    }
    let path = match name.split_once('/') {
        Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" || first.to_lowercase() != first => {
            if !valid_registry(first) {
                return false;
            }
            rest
        }
        _ => name,
    };
    path.split('/').all(valid_path_component)
}

pub(super) fn valid_registry(host: &str) -> bool {
    let (host, port) = match host.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || host.starts_with('[') => (h, Some(p)),
        _ => (host, None),
    };
    if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|c| c.is_ascii_digit())) {
        return false;
    }
    if host.starts_with('[') && host.ends_with(']') {
        return host[1..host.len() - 1].parse::<std::net::Ipv6Addr>().is_ok();
    }
    host.split('.').all(|l| {
        let b = l.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'-')
    })
}

pub(super) fn valid_path_component(s: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let b = s.as_bytes();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &s[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|c| c == b'-')) {
            return false;
        }
    }
    true
}
