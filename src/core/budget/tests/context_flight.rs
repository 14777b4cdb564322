//! Contexts in flight: each member learns whether another member's context was made on
//! the same GPU while its own was, whatever ordinal the GPU has in each process.

use super::*;

#[test]
fn a_context_made_alone_has_no_others() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let f = a.context_started(0).unwrap();
    assert!(a.context_ended(f).alone());
    let f = a.context_started(0).unwrap();
    assert_eq!(a.context_ended(f).others, 0, "the count went back to zero");
    assert!(a.context_started(5).is_none(), "not the pool's device");
}

#[test]
fn contexts_in_flight_at_once_see_each_other() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let b = member(pool, proc(k, 2), Some(1000));
    let c = member(pool, proc(k, 3), Some(1000));
    // a in flight when b starts; c starts and ends inside a's flight.
    let fa = a.context_started(0).unwrap();
    let fb = b.context_started(0).unwrap();
    let fc = c.context_started(0).unwrap();
    assert_eq!(
        c.context_ended(fc).others,
        2,
        "a and b were in flight at its start"
    );
    assert_eq!(a.context_ended(fa).others, 2, "b and c started during it");
    assert_eq!(
        b.context_ended(fb).others,
        2,
        "a in flight, c started during it"
    );
    // Over: the next one is alone again.
    let f = c.context_started(0).unwrap();
    assert!(c.context_ended(f).alone());
}

#[test]
fn the_same_gpu_under_different_ordinals_is_one_flight() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let b = Member::join(pool, proc(k, 2), &MemberInfo::default()).unwrap();
    // b sees the GPU as its ordinal 1 (CUDA_VISIBLE_DEVICES=1,0), and another GPU as 0.
    b.register_gpu(1, &GPU0, Some(1000)).unwrap();
    b.register_gpu(0, &GPU1, Some(1000)).unwrap();
    let fa = a.context_started(0).unwrap();
    let other_gpu = b.context_started(0).unwrap();
    assert!(
        b.context_ended(other_gpu).alone(),
        "another GPU is another flight"
    );
    let fb = b.context_started(1).unwrap();
    assert_eq!(b.context_ended(fb).others, 1);
    assert_eq!(a.context_ended(fa).others, 1);
}

#[test]
fn a_member_killed_while_making_a_context_is_taken_out_of_the_flight() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let b = member(pool, proc(k, 2), Some(1000));
    let _never_ended = b.context_started(0).unwrap();
    k.kill(2);
    let f = a.context_started(0).unwrap();
    assert_eq!(a.context_ended(f).others, 1, "b's context was in flight");
    assert_eq!(a.sweep(), 1, "b's slot taken back");
    let f = a.context_started(0).unwrap();
    assert!(a.context_ended(f).alone(), "b's count went with its slot");
}

#[test]
fn the_figure_measured_alone_is_known_to_every_member() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let b = member(pool, proc(k, 2), Some(1000));
    assert_eq!(b.context_figure(0), None, "none measured yet");
    a.note_context_bytes(0, 0, false);
    assert_eq!(b.context_figure(0), Some(0), "0 is a figure");
    a.note_context_bytes(0, 16, true);
    assert_eq!(b.context_figure(0), Some(16));
    assert_eq!(b.gpu_entry(0), Some(0));
    assert_eq!(b.gpu_entry(3), None);
}
