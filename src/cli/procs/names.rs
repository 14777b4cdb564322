//! Names for what the files hold as numbers: a user's name for a uid (`/etc/passwd`),
//! a GPU's index for its UUID (the driver's, asked once).

use std::collections::HashMap;

/// GPU indexes by UUID: CUDA's ordinals as this `gpucap` sees them (set
/// `CUDA_DEVICE_ORDER=PCI_BUS_ID` for `nvidia-smi`'s order).
/// Their memory too, where the driver said it.
#[derive(Debug, Clone, Default)]
pub struct Gpus(Vec<([u8; 16], Option<u64>)>);

impl Gpus {
    /// Asks the driver (once; no driver: no index is known).
    pub fn probe() -> Gpus {
        match crate::driver::probe() {
            crate::driver::Probe::Devices(d) => Gpus(
                d.iter()
                    .map(|d| (d.uuid.unwrap_or_default(), Some(d.total)))
                    .collect(),
            ),
            _ => Gpus::default(),
        }
    }

    pub fn from_uuids(uuids: Vec<[u8; 16]>) -> Gpus {
        Gpus(uuids.into_iter().map(|u| (u, None)).collect())
    }

    /// With each GPU's memory in bytes.
    pub fn from_totals(gpus: Vec<([u8; 16], u64)>) -> Gpus {
        Gpus(gpus.into_iter().map(|(u, t)| (u, Some(t))).collect())
    }

    pub fn index(&self, uuid: &[u8; 16]) -> Option<u32> {
        self.0.iter().position(|(u, _)| u == uuid).map(|i| i as u32)
    }

    /// The GPU's memory in bytes, where the driver said it.
    pub fn total(&self, uuid: &[u8; 16]) -> Option<u64> {
        self.0.iter().find(|(u, _)| u == uuid).and_then(|(_, t)| *t)
    }
}

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

    #[test]
    fn indexes_by_uuid() {
        let g = Gpus::from_uuids(vec![[1; 16], [2; 16]]);
        assert_eq!((g.index(&[2; 16]), g.index(&[3; 16])), (Some(1), None));
    }
}
