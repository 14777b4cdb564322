//! The frame of this process's ordinal keys (`GPUCAP_ORDINALS`), handed down with them:
//! where the environment gives none that holds, the process's own `CUDA_VISIBLE_DEVICES`
//! (the first), else every GPU, bound to the keys by their digest (`<list>@<digest>`).
//! `gpucap_core::config::plan` hands it to a child with the keys. A `GPUCAP_ORDINALS`
//! bound to other keys (this process set its own since it was handed down) is not
//! handed on: the keys are this process's, and so is the frame.
//!
//! Read at the library's load and between `fork` and `exec` (`hand_down.rs`): no
//! allocation.

use gpucap_core::config;

/// `GPUCAP_ORDINALS`'s name.
pub const ORDINALS: &[u8] = b"GPUCAP_ORDINALS";

/// The frame of an environment's ordinal keys.
pub struct Frame<'a> {
    /// The environment's `GPUCAP_ORDINALS` (the first).
    given: Option<&'a [u8]>,
    /// Its `CUDA_VISIBLE_DEVICES` (the first).
    visible: Option<&'a [u8]>,
    /// The digest of its ordinal keys (`config::keys_digest`).
    keys: u64,
}

impl<'a> Frame<'a> {
    /// Of an environment's `(name, value)`s, whose ordinal keys' digest is `keys`.
    pub fn of(vars: impl Iterator<Item = (&'a [u8], &'a [u8])>, keys: u64) -> Self {
        let mut f = Frame {
            given: None,
            visible: None,
            keys,
        };
        for (name, value) in vars {
            if name == ORDINALS {
                f.given = f.given.or(Some(value));
            } else if name == b"CUDA_VISIBLE_DEVICES" {
                f.visible = f.visible.or(Some(value));
            }
        }
        f
    }

    /// Whether a variable of this name is kept among the process's configuration
    /// variables: one that is handed down, but not a frame bound to other keys.
    pub fn keeps(&self, name: &[u8]) -> bool {
        config::handed_down(name) && !(name == ORDINALS && self.stale())
    }

    /// Puts the frame's entry (`GPUCAP_ORDINALS=<list>@<digest>`, in parts) where the
    /// environment gives none that holds.
    pub fn add(&self, put: impl FnOnce(&[&[u8]])) {
        if let Some(visible) = self.missing() {
            put(&[
                ORDINALS,
                b"=",
                visible,
                b"@",
                &config::digest_hex(self.keys),
            ]);
        }
    }

    /// The environment's frame is bound to other keys than the process's.
    fn stale(&self) -> bool {
        self.given
            .and_then(config::bound_digest)
            .is_some_and(|d| d != self.keys)
    }

    /// The list to add (None: the environment gives a frame that holds, or its list
    /// names no GPU: then the process sees none, and its keys name none either).
    fn missing(&self) -> Option<&'a [u8]> {
        if self.given.is_some() && !self.stale() {
            return None;
        }
        match self.visible {
            None => Some(b"all"),
            Some(v) => config::visible_as_frame(v),
        }
    }
}
