//! The GPU an allocation is charged to: the device of the context current on the
//! allocating thread, however the program switches contexts (`hooks/current.rs` keeps it
//! per thread and forgets it on every context call).

use super::common;

use common::*;

const MIB: u64 = 1 << 20;

#[test]
fn every_byte_is_charged_to_the_gpu_of_the_current_context_on_every_thread() {
    let prog = compile_c("ctxswitch", "", &["-lcuda"]);
    let stats = scratch("ctxswitch").join("stats.json");
    let mut c = fake_cmd(&prog, &stats);
    c.env("FAKECUDA_DEVICES", "3")
        .env("FAKECUDA_TOTAL_MEM", "8Gi");
    preload(&mut c).env("GPUCAP_LIMIT", "0=64Mi,1=128Mi,2=192Mi");
    let o = run(c.args(["64Mi", "128Mi", "192Mi"]));
    assert_passed(&o, "ctxswitch with the shim");
    let s = read_stats(&stats);
    assert_eq!(s.len(), 3);
    for (d, cap) in [64, 128, 192].into_iter().enumerate() {
        assert!(
            s[d].peak_used <= cap * MIB,
            "GPU {d} over its cap in the driver: {:?}",
            s[d]
        );
        assert_eq!(
            s[d].peak_used,
            cap * MIB,
            "GPU {d} was filled to its cap exactly"
        );
        assert_eq!(s[d].final_used, 0, "GPU {d}: {:?}", s[d]);
    }

    // Control: without gpucap the figures are the driver's, and the checks fail.
    let mut c = fake_cmd(&prog, &stats);
    c.env("FAKECUDA_DEVICES", "3")
        .env("FAKECUDA_TOTAL_MEM", "8Gi");
    let o = run(c.args(["64Mi", "128Mi", "192Mi"]));
    assert!(
        !o.status.success(),
        "ctxswitch passed without the shim:\n{}",
        stdout(&o)
    );
}
