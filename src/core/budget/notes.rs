//! What a member tells its owner as it happens (the shim says each in its log): a wait
//! for memory started, served or timed out ([`WaitNote`], `wait.rs`), and a word of the
//! pool file that could not be, found and repaired ([`Repair`], `repair.rs`, `account.rs`,
//! `join.rs`). Types only: the member holds the owner's callbacks for them
//! (`Member::waiting`, `Member::on_repair`).

use std::fmt;
use std::time::Duration;

use super::layout::decode_cap;

/// What a wait tells the shim (for its log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitNote {
    /// `bytes` on CUDA ordinal `device` do not fit now: waiting, behind `ahead` waiters.
    Started {
        device: usize,
        bytes: u64,
        ahead: usize,
    },
    /// Served after `waited`.
    Served {
        device: usize,
        bytes: u64,
        waited: Duration,
    },
    /// `bytes` on CUDA ordinal `device` would take the member past its own `ceiling`:
    /// waiting for its own frees or a raise of the ceiling (`gpucap pool set`).
    AtCeiling {
        device: usize,
        bytes: u64,
        ceiling: u64,
    },
    /// Not served within `GPUCAP_WAIT`.
    TimedOut {
        device: usize,
        bytes: u64,
        waited: Duration,
    },
}

/// A word of the pool file that could not be, found and repaired (for the shim's log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repair {
    /// GPU entry `gpu`'s word lock named no member that could hold it (`word`): freed.
    Lock { gpu: usize, word: u64 },
    /// GPU entry `gpu`'s `used` said `found`, its members hold `members`: recounted.
    Used {
        gpu: usize,
        found: u64,
        members: u64,
    },
    /// GPU entry `gpu`'s cap word said `found` (encoded), this member holds it to
    /// `ours`: written back.
    Cap { gpu: usize, found: u64, ours: u64 },
    /// A slot's guarantee, ceiling or holder bit could not be (see `repair`): cleared,
    /// or (this member's own) written back.
    Share(ShareRepair),
}

impl fmt::Display for Repair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Repair::Lock { gpu, word } => write!(
                f,
                "the pool file's word lock of GPU entry {gpu} held {word:#x}, which no live \
                 member can hold: freed it"
            ),
            Repair::Used {
                gpu,
                found,
                members,
            } => write!(
                f,
                "the pool file said {found} bytes in use on GPU entry {gpu}, its members hold \
                 {members}: recounted (another process wrote the pool file?)"
            ),
            Repair::Cap { gpu, found, ours } => write!(
                f,
                "the pool file's cap word of GPU entry {gpu} said {:?}, its live members hold \
                 it to {:?}: written back (another process wrote the pool file?)",
                decode_cap(found).flatten(),
                decode_cap(ours).flatten()
            ),
            Repair::Share(r) => r.fmt(f),
        }
    }
}

/// What was wrong with one slot's share words on one GPU entry (see the module's rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareFault {
    /// No live member holds the slot, yet its holder bit (or, for a slot just taken,
    /// any share word) is set: cleared.
    NoMember,
    /// The holder bit without a guarantee, or a guarantee without the bit: cleared.
    Bit,
    /// The guarantee is above the pool's cap: cleared.
    AboveCap,
    /// The guarantee is above the slot's own ceiling word: cleared.
    AboveCeiling,
    /// The guarantee does not fit beside the `given` bytes kept for the members before
    /// it (rule 4): cleared.
    NoRoom { given: u64 },
    /// The ceiling word is above the pool's cap: cleared (none: the cap).
    CeilingAboveCap,
    /// This member's own words differ from the `guarantee` and `ceiling` it claimed:
    /// written back.
    Own { guarantee: u64, ceiling: u64 },
}

/// A slot's share words as found, and what is wrong with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareRepair {
    pub gpu: usize,
    pub slot: usize,
    /// The guarantee and ceiling words as found.
    pub guarantee: u64,
    pub ceiling: u64,
    /// The cap the repairer holds the GPU to (`u64::MAX`: none).
    pub cap: u64,
    pub fault: ShareFault,
}

impl fmt::Display for ShareRepair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ShareRepair {
            gpu,
            slot,
            guarantee,
            ceiling,
            cap,
            fault,
        } = *self;
        let words = format!(
            "the pool file's guarantee word of member slot {slot} on GPU entry {gpu} said \
             {guarantee} bytes"
        );
        let cleared = "cleared it (its member, if it lives, writes back its own)";
        match fault {
            ShareFault::NoMember => write!(
                f,
                "{words} (ceiling {ceiling}) with its holder bit set, but no live member \
                 holds the slot: cleared them"
            ),
            ShareFault::Bit => write!(f, "{words}, which its holder bit does not say: {cleared}"),
            ShareFault::AboveCap => {
                write!(f, "{words}, above the pool's {cap}-byte cap: {cleared}")
            }
            ShareFault::AboveCeiling => write!(
                f,
                "{words}, above the same member's ceiling of {ceiling} bytes: {cleared}"
            ),
            ShareFault::NoRoom { given } => write!(
                f,
                "{words}, which does not fit beside the {given} bytes guaranteed to the \
                 members that joined before it in the pool's {cap}-byte cap (it could not \
                 have been admitted): {cleared}"
            ),
            ShareFault::CeilingAboveCap => write!(
                f,
                "the pool file's ceiling word of member slot {slot} on GPU entry {gpu} said \
                 {ceiling} bytes, above the pool's {cap}-byte cap: {cleared}"
            ),
            ShareFault::Own {
                guarantee: g,
                ceiling: c,
            } => write!(
                f,
                "{words} and its ceiling word {ceiling}, this member's own slot, which \
                 claimed a guarantee of {g} and a ceiling of {c} bytes: written back"
            ),
        }
    }
}
