//! A claim's file as its words at rest (`live`): the members' marks of the slots they
//! took (written when a member joins and leaves, cleared for members gone before words
//! are made from the file again), and the memfd's stamp of the file it was made from
//! (a joiner handed a memfd of another file is refused: the file was replaced).

use std::os::fd::RawFd;

use crate::sys::{read_word, write_word};

/// Before words are made from the claim's file `file`: its marks of slots taken by
/// members now gone (no process holds the slot's lock or its children byte: killed, or
/// dead without leaving, their memory the driver's no more) are cleared, so that the
/// file's words at rest show no member that is not there.
pub(super) fn clear_gone_marks(file: RawFd) {
    use gpucap_core::budget::{H_GEOMETRY, H_SLOTS_SEEN, STATE_EMPTY, STATE_LIVE, STATES_AT};
    let Some(slots) = read_word(file, H_GEOMETRY).and_then(gpucap_core::budget::geometry_slots)
    else {
        return;
    };
    // The states in one read: the first member of every claim's start comes here.
    let mut states = vec![0u8; slots * 8];
    // SAFETY: a descriptor and a buffer of `slots * 8` bytes.
    let n = unsafe {
        libc::pread(
            file,
            states.as_mut_ptr().cast(),
            states.len(),
            (STATES_AT * 8) as libc::off_t,
        )
    };
    if n != states.len() as isize {
        return;
    }
    let taken = states
        .chunks_exact(8)
        .enumerate()
        .filter(|(_, w)| u64::from_le_bytes((*w).try_into().unwrap_or_default()) == STATE_LIVE)
        .map(|(s, _)| s);
    let mut kept = false;
    for s in taken {
        if crate::locks::slot_or_children_held(file, s) {
            kept = true;
        } else {
            write_word(file, STATES_AT + s, STATE_EMPTY);
        }
    }
    // No mark left: the count of slots ever taken back to the file's own (0: its words
    // at rest never had a member), which the marks had raised to every slot.
    if !kept && read_word(file, H_SLOTS_SEEN) != Some(0) {
        write_word(file, H_SLOTS_SEEN, 0);
    }
}

/// Whether the claim's file `file` marks slot `s` taken by a member that has not left
/// (`PoolFile::mark_in_file`).
pub(super) fn taken_in_file(file: RawFd, s: usize) -> bool {
    read_word(file, gpucap_core::budget::STATES_AT + s) == Some(gpucap_core::budget::STATE_LIVE)
}

/// Writes `file`'s device and inode into the memfd `m`'s header (`H_FILE_DEV`,
/// `H_FILE_INO`): false where either cannot be done.
pub(super) fn stamp_file(m: RawFd, file: RawFd) -> bool {
    let Some((dev, ino)) = crate::kept::identity(file) else {
        return false;
    };
    let mut words = [0u8; 16];
    words[..8].copy_from_slice(&dev.to_le_bytes());
    words[8..].copy_from_slice(&ino.to_le_bytes());
    let at = (gpucap_core::budget::H_FILE_DEV * 8) as libc::off_t;
    // SAFETY: our memfd and a buffer of 16 bytes.
    unsafe { libc::pwrite(m, words.as_ptr().cast(), 16, at) == 16 }
}

/// Whether the memfd `m` was made from `file` (its header's `H_FILE_DEV`, `H_FILE_INO`);
/// a memfd made before the words had that use (both 0) is taken as it is.
pub(super) fn made_from(m: RawFd, file: RawFd) -> bool {
    let mut words = [0u8; 16];
    let at = (gpucap_core::budget::H_FILE_DEV * 8) as libc::off_t;
    // SAFETY: a descriptor and a buffer of 16 bytes.
    if unsafe { libc::pread(m, words.as_mut_ptr().cast(), 16, at) } != 16 {
        return false;
    }
    let word =
        |i: usize| u64::from_le_bytes(words[i * 8..i * 8 + 8].try_into().unwrap_or_default());
    let stamped = (word(0), word(1));
    stamped == (0, 0) || crate::kept::identity(file) == Some(stamped)
}
