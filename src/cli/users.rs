//! Users' names for the uids the files hold (`/etc/passwd`), as `status`, `top` and the
//! pool tables show them, and `--user`'s check.

use std::collections::HashMap;

/// The name of `uid` in `/etc/passwd`, else the number.
pub fn user_name(uid: u32) -> String {
    thread_local! {
        static NAMES: std::cell::RefCell<HashMap<u32, String>> = Default::default();
    }
    NAMES.with(|n| {
        n.borrow_mut()
            .entry(uid)
            .or_insert_with(|| {
                let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
                name_in(&passwd, uid).unwrap_or_else(|| uid.to_string())
            })
            .clone()
    })
}

/// Why `--user VALUE` names no user `top` could show, or None: a uid (a number that fits
/// one), or a name in `/etc/passwd` (where `top` reads the names it shows).
pub fn unknown_user(value: &str) -> Option<String> {
    if value.is_empty() {
        return Some("an empty --user (a user's name or uid)".to_string());
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        return value
            .parse::<u32>()
            .is_err()
            .then(|| format!("--user {value}: not a uid (at most {})", u32::MAX));
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let known = passwd.lines().any(|l| l.split(':').next() == Some(value));
    (!known).then(|| format!("--user {value:?}: no such user in /etc/passwd (give the uid)"))
}

/// The name of `uid` in a passwd file's text.
fn name_in(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        let id = f.nth(1)?.parse::<u32>().ok()?;
        (id == uid && !name.is_empty()).then(|| name.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_passwd() {
        let p = "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/a:/bin/sh\nbad line\n";
        assert_eq!(name_in(p, 1000).as_deref(), Some("alice"));
        assert_eq!(name_in(p, 0).as_deref(), Some("root"));
        assert_eq!(name_in(p, 5), None);
    }
}
