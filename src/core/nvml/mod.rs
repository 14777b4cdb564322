//! What NVML reports under a cap (`nvmlDeviceGetMemoryInfo`, `_v2`), so that
//! `nvidia-smi`, `nvidia-ml-py`/`pynvml` and the frameworks that read NVML agree with
//! `cuMemGetInfo`: the total is the cap, the free memory the same capped figure
//! `cuMemGetInfo` shows for the device, and used the rest (`_v2`'s reserved is 0 under a
//! cap: see [`capped_v2`]).
//!
//! The NVML device is matched to a CUDA ordinal by UUID (see `identity`); a GPU that
//! CUDA does not see in this process, or one without a cap, is shown as the driver
//! reports it.
//!
//! Reading NVML never initialises CUDA (nor loads it): a monitor such as `nvidia-smi`
//! is not a CUDA process and must not become one. When the process itself initialised
//! CUDA, the driver says which devices it sees. Otherwise [`cuda_view`] works out what
//! CUDA would see from NVML's own enumeration and `CUDA_VISIBLE_DEVICES`, as the
//! driver reads it; the approximation is CUDA's device order (see `cuda_view`).
//!
//! In a pool (`GPUCAP_POOL`), a GPU of the pool shows the pool's figures ([`within_pool`]:
//! what every member holds counts as used) and `nvmlDeviceGetComputeRunningProcesses`
//! lists the pool's live members holding memory of it ([`pool_gpu`], [`listing`]).
//!
//! Files: `memory.rs` (the memory figures), `processes.rs` (the process lists and a
//! pool's GPU), `devices.rs` (UUIDs and what CUDA sees); the tests here cover all three.

mod devices;
mod memory;
mod processes;

pub use devices::{NvmlGpu, NvmlMig, PciInfo, cuda_view, uuid_text};
pub use memory::{
    MEMORY_V2_VERSION, MemoryInfo, NvmlMemory, NvmlMemoryV2, capped, capped_v2, within_cap,
    within_pool,
};
pub use processes::{
    Listing, NO_INSTANCE, NvmlProcessDetailV1, NvmlProcessV1, NvmlProcessV2,
    PROCESS_DETAIL_LIST_V1, PROCESS_MODE_ALL, PROCESS_MODE_COMPUTE, PoolGpu, ProcessInfo, listing,
    pool_gpu,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::PoolView;

    const GI: u64 = 1 << 30;

    #[test]
    fn uuid_text_spells_nvml_uuids() {
        let u: [u8; 16] = std::array::from_fn(|i| (i as u8) * 0x11);
        assert_eq!(
            uuid_text("GPU", &u),
            "GPU-00112233-4455-6677-8899-aabbccddeeff"
        );
        assert_eq!(
            uuid_text("MIG", &[0xff; 16]),
            "MIG-ffffffff-ffff-ffff-ffff-ffffffffffff"
        );
        assert_eq!(uuid_text("", &u), "00112233-4455-6677-8899-aabbccddeeff");
    }

    #[test]
    fn v1_shows_the_cap() {
        let driver = NvmlMemory {
            total: 80 * GI,
            free: 70 * GI,
            used: 10 * GI,
        };
        assert_eq!(
            capped(driver, (3 * GI, 4 * GI)),
            NvmlMemory {
                total: 4 * GI,
                free: 3 * GI,
                used: GI
            }
        );
        assert_eq!(capped(driver, (5 * GI, 4 * GI)).used, 0, "never negative");
    }

    #[test]
    fn v2_reserves_nothing_inside_the_cap() {
        let driver = NvmlMemoryV2 {
            version: 0x0200_0028,
            total: 80 * GI,
            reserved: GI / 2,
            free: 70 * GI,
            used: 9 * GI,
        };
        let v = capped_v2(driver, (3 * GI, 4 * GI));
        assert_eq!(
            v,
            NvmlMemoryV2 {
                version: 0x0200_0028,
                total: 4 * GI,
                reserved: 0,
                free: 3 * GI,
                used: GI
            }
        );
        let v1 = capped(
            NvmlMemory {
                total: 80 * GI,
                free: 70 * GI,
                used: 10 * GI,
            },
            (3 * GI, 4 * GI),
        );
        assert_eq!(v.used, v1.used, "v1 and v2 agree on used");
        assert_eq!(
            capped_v2(driver, (5 * GI, 4 * GI)).used,
            0,
            "never negative"
        );
    }

    fn u(n: u8, mig: bool) -> [u8; 16] {
        let mut u = [0u8; 16];
        u[0] = 0xfa;
        u[1] = 0xce;
        u[3] = mig as u8;
        u[15] = n;
        u
    }

    /// GPUs 0..n, PCI bus n+1, MIG on for those in `mig`.
    fn gpus(n: u8, mig: &[u8]) -> Vec<NvmlGpu> {
        (0..n)
            .map(|i| NvmlGpu {
                uuid: u(i, false),
                pci: Some((0, i as u32 + 1, 0)),
                migs: mig.contains(&i).then(|| {
                    vec![NvmlMig {
                        uuid: u(i, true),
                        gi_ci: Some((0, 0)),
                    }]
                }),
            })
            .collect()
    }

    #[test]
    fn cuda_visible_devices_as_the_driver_reads_it() {
        let g = gpus(4, &[]);
        let v = |s: Option<&str>| cuda_view(&g, s);
        let ids = |n: &[u8]| n.iter().map(|&i| u(i, false)).collect::<Vec<_>>();
        assert_eq!(v(None), ids(&[0, 1, 2, 3]));
        assert_eq!(v(Some("2,0")), ids(&[2, 0]));
        assert_eq!(v(Some(" 1 , 3")), ids(&[1, 3]));
        assert_eq!(
            v(Some("0,2,-1,1")),
            ids(&[0, 2]),
            "cut at the first invalid entry"
        );
        assert_eq!(v(Some("4,0")), ids(&[]));
        assert_eq!(v(Some("")), ids(&[]), "set but empty: no devices");
        assert_eq!(v(Some("1,1,2")), ids(&[1]));
        assert_eq!(v(Some("0,,1")), ids(&[0]));
        assert_eq!(
            v(Some("GPU-face0000-0000-0000-0000-000000000002,0")),
            ids(&[2, 0])
        );
        assert_eq!(
            v(Some("gpu-FACE0000-0000-0000-0000-000000000003")),
            ids(&[3])
        );
        assert_eq!(
            v(Some("GPU-face0000-0000-0000-0000-00000000000")),
            ids(&[]),
            "a prefix must name exactly one GPU"
        );
        assert_eq!(v(Some("1,GPU-dead")), ids(&[1]));
        assert_eq!(v(Some("GPU-")), ids(&[]));
        assert_eq!(
            v(Some("MIG-face0001-0000-0000-0000-000000000001")),
            ids(&[]),
            "no MIG device without MIG mode"
        );
    }

    #[test]
    fn gpus_in_pci_order_whatever_nvml_lists_first() {
        let mut g = gpus(3, &[]);
        g.reverse();
        assert_eq!(cuda_view(&g, Some("0")), vec![u(0, false)]);
        // Without PCI addresses, NVML's order.
        for x in &mut g {
            x.pci = None;
        }
        assert_eq!(cuda_view(&g, Some("0")), vec![u(2, false)]);
    }

    #[test]
    fn mig_devices_are_cudas_devices() {
        let g = gpus(3, &[0, 2]);
        assert_eq!(
            cuda_view(&g, None),
            vec![u(0, true), u(1, false), u(2, true)]
        );
        assert_eq!(
            cuda_view(&g, Some("MIG-face0001-0000-0000-0000-000000000002,0,1")),
            vec![u(2, true), u(0, true), u(1, false)],
            "an index of a GPU in MIG mode names its MIG device"
        );
        assert_eq!(
            cuda_view(&g, Some("GPU-face0000-0000-0000-0000-000000000002")),
            vec![u(2, true)]
        );
        assert_eq!(
            cuda_view(
                &g,
                Some("MIG-GPU-face0000-0000-0000-0000-000000000000/0/0,1")
            ),
            vec![u(0, true), u(1, false)]
        );
        assert_eq!(
            cuda_view(&g, Some("MIG-GPU-face0000-0000-0000-0000-000000000000/1/0")),
            Vec::<[u8; 16]>::new()
        );
        assert_eq!(
            cuda_view(&g, Some("MIG-face0001")),
            Vec::<[u8; 16]>::new(),
            "ambiguous"
        );
    }

    /// A member: pid, alive, (GPU, bytes) held.
    type Held<'a> = (u32, bool, &'a [([u8; 16], u64)]);

    fn pool(members: &[Held]) -> PoolView {
        use crate::budget::{GpuView, MemberGpuView, MemberView};
        let gpu = |raw: [u8; 16], cap: Option<u64>, used: u64| GpuView {
            uuid: uuid_text("GPU", &raw),
            cap,
            used,
            peak: used,
            refusals: 0,
            largest_refused: 0,
            held_by_dead: 0,
            waiters: 0,
            waits: 0,
            wait_ms: 0,
            members_hold: used,
            drift: 0,
            cap_drift: false,
            lock: None,
            raw_uuid: raw,
            guaranteed: 0,
            share_drift: false,
            resized: false,
        };
        let used_of = |raw: [u8; 16]| {
            members
                .iter()
                .flat_map(|m| m.2.iter())
                .filter(|g| g.0 == raw)
                .map(|g| g.1)
                .sum()
        };
        PoolView {
            slots: 256,
            version: 1,
            created: 0,
            gpus: vec![
                gpu(u(0, false), Some(GI), used_of(u(0, false))),
                gpu(u(1, false), None, used_of(u(1, false))),
            ],
            members: members
                .iter()
                .enumerate()
                .map(|(slot, &(pid, alive, gpus))| MemberView {
                    slot,
                    pid,
                    uid: None,
                    pid_namespace: 0,
                    command: String::new(),
                    start_ms: 0,
                    alive,
                    held_by_children: false,
                    gpus: gpus
                        .iter()
                        .map(|&(raw, used)| MemberGpuView {
                            uuid: uuid_text("GPU", &raw),
                            used,
                            peak: used,
                            raw_uuid: raw,
                            guarantee: 0,
                            ceiling: None,
                            borrowed: used,
                            ceiling_from: None,
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    const MI: u64 = 1 << 20;

    #[test]
    fn a_pool_gpu_lists_its_live_members_holding_memory() {
        let (g0, g1) = (u(0, false), u(1, false));
        let view = pool(&[
            (100, true, &[(g0, 300 * MI)]),
            (101, true, &[(g0, 200 * MI), (g1, 5 * MI)]),
            (102, true, &[(g0, 0)]),        // a member holding nothing of it
            (103, false, &[(g0, 50 * MI)]), // died; not taken back yet
            (104, true, &[(g1, MI)]),
        ]);
        assert_eq!(
            pool_gpu(&view, &g0),
            Some(PoolGpu {
                cap: Some(GI),
                used: 550 * MI,
                processes: vec![(100, 300 * MI), (101, 200 * MI)],
            }),
            "the dead member's bytes stay in used until taken back, but it is not listed"
        );
        assert_eq!(
            pool_gpu(&view, &g1).map(|g| (g.cap, g.processes)),
            Some((None, vec![(101, 5 * MI), (104, MI)]))
        );
        assert_eq!(pool_gpu(&view, &u(2, false)), None, "not a GPU of the pool");
    }

    #[test]
    fn a_pool_gpu_shows_the_pool_used_within_the_cap() {
        // Physical 80 GiB, 70 free; cap 4 GiB of which the pool holds 1.5.
        assert_eq!(
            within_pool((70 * GI, 80 * GI), 4 * GI, 3 * GI / 2),
            (5 * GI / 2, 4 * GI)
        );
        // The physical GPU has less free than the cap leaves: that shows.
        assert_eq!(within_pool((GI, 80 * GI), 4 * GI, GI), (GI, 4 * GI));
        // Over the cap (a member died holding memory and the cap was lowered): 0 free.
        assert_eq!(within_pool((70 * GI, 80 * GI), 4 * GI, 5 * GI), (0, 4 * GI));
        // A GPU smaller than the cap.
        assert_eq!(within_pool((GI, 2 * GI), 4 * GI, 0), (GI, 2 * GI));
        // An empty pool shows what a process holding nothing sees.
        assert_eq!(
            within_pool((70 * GI, 80 * GI), 4 * GI, 0),
            within_cap((70 * GI, 80 * GI), 4 * GI)
        );
        let v1 = capped(
            NvmlMemory::default(),
            within_pool((70 * GI, 80 * GI), GI, 500 * MI),
        );
        assert_eq!(
            (v1.total, v1.used),
            (GI, 500 * MI),
            "v1 used = the pool's used"
        );
    }

    #[test]
    fn the_running_processes_count_protocol() {
        // The size query: *infoCount = 0, no array.
        assert_eq!(listing(2, 0, false), Listing::TooSmall(2));
        assert_eq!(listing(0, 0, false), Listing::Write(0), "SUCCESS if none");
        assert_eq!(listing(0, 0, true), Listing::Write(0));
        assert_eq!(listing(3, 2, true), Listing::TooSmall(3));
        assert_eq!(listing(3, 3, true), Listing::Write(3));
        assert_eq!(
            listing(3, 9, true),
            Listing::Write(3),
            "*infoCount = the number written"
        );
        assert_eq!(
            listing(3, 9, false),
            Listing::TooSmall(3),
            "no array to write to"
        );
    }

    #[test]
    fn process_structs_as_nvml_lays_them_out() {
        let p = <NvmlProcessV2 as ProcessInfo>::new(7, 9, None);
        assert_eq!(
            (p.gpu_instance_id, p.compute_instance_id),
            (NO_INSTANCE, NO_INSTANCE),
            "0xFFFFFFFF outside MIG"
        );
        let p = <NvmlProcessV2 as ProcessInfo>::new(7, 9, Some((1, 0)));
        assert_eq!(
            (
                p.pid,
                p.used_gpu_memory,
                p.gpu_instance_id,
                p.compute_instance_id
            ),
            (7, 9, 1, 0)
        );
        assert_eq!(std::mem::offset_of!(NvmlProcessV2, used_gpu_memory), 8);
        assert_eq!(std::mem::offset_of!(NvmlProcessV2, gpu_instance_id), 16);
        assert_eq!(std::mem::offset_of!(NvmlProcessV2, compute_instance_id), 20);
        assert_eq!(std::mem::offset_of!(NvmlProcessV1, used_gpu_memory), 8);
    }

    #[test]
    fn an_nvml_only_process_sees_the_cap() {
        assert_eq!(within_cap((70 * GI, 80 * GI), 4 * GI), (4 * GI, 4 * GI));
        assert_eq!(within_cap((GI, 80 * GI), 4 * GI), (GI, 4 * GI));
        assert_eq!(within_cap((GI, 2 * GI), 4 * GI), (GI, 2 * GI));
        assert_eq!(
            uuid_text("MIG", &u(9, true)),
            "MIG-face0001-0000-0000-0000-000000000009"
        );
    }
}
