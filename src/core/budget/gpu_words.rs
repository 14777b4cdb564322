//! The words a change of a member's use on one GPU entry touches, found once when the
//! member joins: a reservation or a credit then pays one bounds check for all of them,
//! not one (with its index arithmetic) per word.

use std::sync::atomic::AtomicU64;

use super::layout::{GPU_WORDS, MARK_WORDS, PER_GPU_WORDS, SHARE_HEAD_WORDS, Words};

/// Slot `slot`'s words and the pool's words for one GPU entry.
#[derive(Clone, Copy)]
pub(super) struct GpuWords<'a> {
    /// The member's own words on the GPU (`M_USED`, `M_PEAK`, `M_PENDING`, ...).
    pub mine: &'a [AtomicU64; PER_GPU_WORDS],
    /// The member's traffic marks on the GPU (`T_FREEING`, `T_FREED`, ...).
    pub marks: &'a [AtomicU64; MARK_WORDS],
    /// The GPU entry's words (`G_USED`, `G_PEAK`, `G_WAITERS`, ...).
    pub gpu: &'a [AtomicU64; GPU_WORDS],
    /// The GPU entry's bits of the first 256 slots that hold a guarantee...
    pub bits: &'a [AtomicU64; SHARE_HEAD_WORDS],
    /// ...and of the others' (empty in a pool of 256 members or fewer).
    pub more: &'a [AtomicU64],
    /// The GPU entry.
    pub g: usize,
}

impl<'a> GpuWords<'a> {
    /// Slot `s`'s words for GPU entry `g` (None: `s` or `g` past the layout's).
    pub fn of(w: Words<'a>, s: usize, g: usize) -> Option<Self> {
        Some(GpuWords {
            mine: w.member_gpu_all(s, g)?,
            marks: w.marks_all(s, g)?,
            gpu: w.gpu_all(g)?,
            bits: w.share_bits_split(g)?.0,
            more: w.share_bits_split(g)?.1,
            g,
        })
    }
}
