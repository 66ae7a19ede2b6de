//! The grammar of names that cross the host/driver boundary: iSCSI names, CHAP credentials and
//! backing-store names. Shared by drivers (to refuse bad input early) and by the host (which
//! refuses it again before any command runs). Pure, no dependencies.

/// The longest iSCSI name RFC 3720 allows, in bytes.
pub const MAX_ISCSI_NAME: usize = 223;

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameError(pub String);

impl std::fmt::Display for NameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NameError {}

fn err(what: &str, why: impl std::fmt::Display) -> NameError {
    NameError(format!("{what}: {why}"))
}

/// Checks an iSCSI name (RFC 3720 section 3.2.6): `iqn.YYYY-MM.reversed.domain[:unique]`,
/// `eui.` + 16 hex digits or `naa.` + 16 or 32 hex digits; normalised to lower case; at most 223
/// bytes. Only `a-z`, `0-9`, `-`, `.` and `:` are allowed, so a valid name can never carry shell
/// metacharacters, whitespace, `#`, `,` or control characters.
pub fn check_iscsi_name(name: &str) -> Result<(), NameError> {
    let what = "invalid iSCSI name";
    if name.is_empty() {
        return Err(err(what, "it is empty"));
    }
    if name.len() > MAX_ISCSI_NAME {
        return Err(err(what, format!("it is {} bytes long, the limit is {MAX_ISCSI_NAME}", name.len())));
    }
    if let Some(bad) = name.chars().find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '-' | '.' | ':')) {
        return Err(err(
            what,
            format!("character {bad:?} is not allowed (only lower-case a-z, 0-9, '-', '.', ':')"),
        ));
    }
    if let Some(hex) = name.strip_prefix("eui.") {
        return check_hex(hex, &[16]).map_err(|why| err(what, why));
    }
    if let Some(hex) = name.strip_prefix("naa.") {
        return check_hex(hex, &[16, 32]).map_err(|why| err(what, why));
    }
    let Some(rest) = name.strip_prefix("iqn.") else {
        return Err(err(what, "it must start with 'iqn.', 'eui.' or 'naa.'"));
    };
    let (date, rest) = rest.split_once('.').ok_or_else(|| err(what, "no naming authority after the date"))?;
    let date_ok = date.len() == 7
        && date.as_bytes()[4] == b'-'
        && date[..4].bytes().all(|b| b.is_ascii_digit())
        && matches!(date[5..].parse::<u8>(), Ok(1..=12));
    if !date_ok {
        return Err(err(what, format!("{date:?} is not a YYYY-MM date")));
    }
    let authority = rest.split_once(':').map_or(rest, |(authority, _)| authority);
    let labels_ok = !authority.is_empty()
        && authority.split('.').all(|label| {
            !label.is_empty() && !label.starts_with('-') && !label.ends_with('-') && !label.contains(':')
        });
    if !labels_ok {
        return Err(err(what, format!("{authority:?} is not a reversed domain name")));
    }
    if let Some((_, unique)) = rest.split_once(':')
        && unique.is_empty()
    {
        return Err(err(what, "nothing follows ':'"));
    }
    Ok(())
}

fn check_hex(hex: &str, lengths: &[usize]) -> Result<(), String> {
    if !lengths.contains(&hex.len()) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("expected {lengths:?} hex digits after the prefix"));
    }
    Ok(())
}

/// The shortest CHAP secret accepted (RFC 3720 recommends at least 12 characters; Microsoft's
/// initiator requires 12 to 16).
pub const MIN_CHAP_SECRET: usize = 12;
/// The longest CHAP user name or secret accepted.
pub const MAX_CHAP_FIELD: usize = 64;

/// Checks a CHAP user name: 1 to 64 characters of `[A-Za-z0-9]`.
pub fn check_chap_username(user: &str) -> Result<(), NameError> {
    check_alnum("invalid CHAP user name", user, 1)
}

/// Checks a CHAP secret: 12 to 64 characters of `[A-Za-z0-9]`. The error never quotes the secret.
pub fn check_chap_secret(secret: &str) -> Result<(), NameError> {
    check_alnum("invalid CHAP secret", secret, MIN_CHAP_SECRET).map_err(|_| {
        NameError(format!(
            "invalid CHAP secret: it must be {MIN_CHAP_SECRET} to {MAX_CHAP_FIELD} characters of [A-Za-z0-9]"
        ))
    })
}

fn check_alnum(what: &str, value: &str, min: usize) -> Result<(), NameError> {
    if value.len() < min || value.len() > MAX_CHAP_FIELD {
        return Err(err(what, format!("it must be {min} to {MAX_CHAP_FIELD} characters long")));
    }
    if !value.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(err(what, "only the characters A-Z, a-z and 0-9 are allowed"));
    }
    Ok(())
}

/// The longest backing-store name.
pub const MAX_STORE_NAME: usize = 128;

/// Checks a backing-store name: 1 to 128 characters of `[a-z0-9._-]`, starting with a letter or a
/// digit. Such a name can never be a path: no `/`, and never `.` or `..`.
pub fn check_store_name(name: &str) -> Result<(), NameError> {
    let what = "invalid backing-store name";
    if name.is_empty() || name.len() > MAX_STORE_NAME {
        return Err(err(what, format!("it must be 1 to {MAX_STORE_NAME} characters long")));
    }
    if !name.as_bytes()[0].is_ascii_lowercase() && !name.as_bytes()[0].is_ascii_digit() {
        return Err(err(what, "it must start with a-z or 0-9"));
    }
    if !name.bytes().all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-')) {
        return Err(err(what, "only a-z, 0-9, '.', '_' and '-' are allowed"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_initiator_and_target_names_are_accepted() {
        for name in [
            "iqn.1993-08.org.debian:01:6a0b2c3d4e5f",
            "iqn.1994-05.com.redhat:8f3e1a2b",
            "iqn.1991-05.com.microsoft:host01.example.com",
            "iqn.2010-10.org.openstack:volume-8b1ec3fe-8c57-45ca-a1cf-a481bfc8fce2",
            "iqn.2004-10.com.ubuntu",
            "eui.02004567a425678d",
            "naa.52004567ba64678d",
            "naa.52004567ba64678d52004567ba64678d",
        ] {
            assert_eq!(check_iscsi_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn hostile_and_malformed_names_are_refused() {
        let long = format!("iqn.2010-10.org.openstack:{}", "a".repeat(MAX_ISCSI_NAME));
        for name in [
            "",
            "iqn.2010-10.org.openstack:vol;rm -rf /",
            "iqn.2010-10.org.openstack:$(reboot)",
            "iqn.2010-10.org.openstack:`id`",
            "iqn.2010-10.org.openstack:a b",
            "iqn.2010-10.org.openstack:a#b",
            "iqn.2010-10.org.openstack:a\nb",
            "iqn.2010-10.org.openstack:a\0b",
            "iqn.2010-10.org.openstack:a,b",
            "iqn.2010-10.org.openstack:A",
            "iqn.2010-13.org.openstack:a",
            "iqn.10-10.org.openstack:a",
            "iqn.2010-10.:a",
            "iqn.2010-10.org.openstack:",
            "iqn.2010-10.-org.openstack:a",
            "eui.123",
            "naa.zz004567ba64678d",
            "foo.2010-10.org.openstack",
            long.as_str(),
        ] {
            assert!(check_iscsi_name(name).is_err(), "{name:?} should be refused");
        }
    }

    #[test]
    fn chap_fields_are_alphanumeric_and_bounded() {
        assert_eq!(check_chap_username("u5erName"), Ok(()));
        assert_eq!(check_chap_secret("abcdefABCDEF1234"), Ok(()));
        assert!(check_chap_username("").is_err());
        assert!(check_chap_username("user name").is_err());
        assert!(check_chap_username("user#1").is_err());
        assert!(check_chap_secret("short").is_err());
        assert!(check_chap_secret("abcdefABCDEF1234\n").is_err());
        assert!(check_chap_secret(&"a".repeat(MAX_CHAP_FIELD + 1)).is_err());
        let refused = check_chap_secret("abcdefABCDEF$(id)").unwrap_err();
        assert!(!refused.0.contains("abcdef"), "the error must not quote the secret");
    }

    #[test]
    fn store_names_can_never_be_paths() {
        assert_eq!(check_store_name("volume-8b1ec3fe-8c57-45ca-a1cf-a481bfc8fce2"), Ok(()));
        for name in ["", ".", "..", "../etc", "a/b", "/abs", "-x", "A", &"a".repeat(MAX_STORE_NAME + 1)] {
            assert!(check_store_name(name).is_err(), "{name:?} should be refused");
        }
    }
}
