//! Checks that need their own process: the fake reads its configuration once per process,
//! and FAKECUDA_SHARED is about several processes. Each test drives copies of this test
//! binary running `shell` (below): a tiny command interpreter over the exports, one command
//! per stdin line, one `>> ` answer line per command.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use crate::abi::cstr;
use crate::abi::types::{CUipcMemHandle, CUmemAccessDesc, CUmemLocation};
use crate::api::context::{
    cuCtxAttach, cuCtxCreate_v2, cuCtxDestroy_v2, cuCtxDetach, cuCtxSetCurrent, cuCtxSynchronize,
    cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxReset_v2,
    cuDevicePrimaryCtxRetain, cuProfilerInitialize,
};
use crate::api::copy::{cuMemcpyDtoH_v2, cuMemcpyHtoD_v2};
use crate::api::device::{
    cuDeviceGetCount, cuDeviceGetName, cuDeviceGetPCIBusId, cuDeviceGetUuid, cuDeviceGetUuid_v2,
    cuDriverGetVersion, cuInit,
};
use crate::api::ipc::{cuIpcCloseMemHandle, cuIpcGetMemHandle, cuIpcOpenMemHandle_v2};
use crate::api::memory::{cuMemAlloc_v2, cuMemFree_v2, cuMemGetInfo_v2};
use crate::api::pool::{
    cuDeviceGetDefaultMemPool, cuMemAllocAsync, cuMemFreeAsync, cuMemPoolGetAccess,
    cuMemPoolGetAttribute, cuMemPoolSetAccess,
};
use crate::model::device::ledger;
use libc::c_int;
use std::ptr::null;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The command interpreter (does nothing unless run by `Shell::spawn`).
#[test]
fn shell() {
    if std::env::var_os("FAKECUDA_TEST_SHELL").is_none() {
        return;
    }
    let mut ptrs: Vec<u64> = Vec::new();
    let mut created: Vec<usize> = Vec::new();
    let mut attached: Vec<usize> = Vec::new();
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line.unwrap();
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> u64 { w[i].parse().unwrap() };
        let dev = |i: usize| -> c_int { w[i].parse().unwrap() };
        // SAFETY: every call gets valid pointers to locals, as a C caller would pass.
        let answer: String = unsafe {
            match w[0] {
                "init" => format!("{}", cuInit(0)),
                "count" => {
                    let mut n = -1;
                    let rc = cuDeviceGetCount(&mut n);
                    format!("{rc} {n}")
                }
                "ctx" => {
                    let mut c = 0;
                    let rc = cuDevicePrimaryCtxRetain(&mut c, dev(1));
                    if rc == 0 {
                        assert_eq!(cuCtxSetCurrent(c), 0);
                    }
                    format!("{rc}")
                }
                "release" => format!("{}", cuDevicePrimaryCtxRelease_v2(dev(1))),
                "reset" => format!("{}", cuDevicePrimaryCtxReset_v2(dev(1))),
                "create" => {
                    let mut c = 0;
                    let rc = cuCtxCreate_v2(&mut c, 0, dev(1));
                    if rc == 0 {
                        created.push(c);
                    }
                    format!("{rc}")
                }
                "destroy" => format!("{}", cuCtxDestroy_v2(created.pop().unwrap())),
                // cuCtxAttach to the current context; `detach` detaches the last one attached.
                "attach" => {
                    let mut c = 0;
                    let rc = cuCtxAttach(&mut c, 0);
                    if rc == 0 {
                        attached.push(c);
                    }
                    format!("{rc}")
                }
                "detach" => format!("{}", cuCtxDetach(*attached.last().unwrap())),
                "state" => {
                    let (mut flags, mut active) = (0, -1);
                    let rc = cuDevicePrimaryCtxGetState(dev(1), &mut flags, &mut active);
                    format!("{rc} {active}")
                }
                "version" => {
                    let mut v = 0;
                    let rc = cuDriverGetVersion(&mut v);
                    format!("{rc} {v}")
                }
                "profinit" => format!("{}", cuProfilerInitialize(null(), null(), 0)),
                // An int attribute of device D's default pool: `poolattr D ATTR`.
                "poolattr" => {
                    let mut pool = 0;
                    assert_eq!(cuDeviceGetDefaultMemPool(&mut pool, dev(1)), 0);
                    let mut v = 0x5555;
                    let rc = cuMemPoolGetAttribute(pool, dev(2), (&mut v as *mut c_int).cast());
                    format!("{rc} {v}")
                }
                // Device D's access to device P's default pool: `poolaccess P D`, and
                // `poolgrant P D FLAGS` sets it.
                "poolaccess" | "poolgrant" => {
                    let mut pool = 0;
                    assert_eq!(cuDeviceGetDefaultMemPool(&mut pool, dev(1)), 0);
                    let location = CUmemLocation {
                        type_: 1,
                        id: dev(2),
                    };
                    if w[0] == "poolgrant" {
                        let desc = CUmemAccessDesc {
                            location,
                            flags: dev(3),
                        };
                        format!("{}", cuMemPoolSetAccess(pool, &desc, 1))
                    } else {
                        let mut flags = -1;
                        let rc = cuMemPoolGetAccess(&mut flags, pool, &location);
                        format!("{rc} {flags}")
                    }
                }
                "alloc" => {
                    let mut p = 0;
                    let rc = cuMemAlloc_v2(&mut p, num(1) as usize);
                    ptrs.push(p);
                    format!("{rc} {}", ptrs.len() - 1)
                }
                "asyncalloc" => {
                    let mut p = 0;
                    let rc = cuMemAllocAsync(&mut p, num(1) as usize, 0);
                    ptrs.push(p);
                    format!("{rc} {}", ptrs.len() - 1)
                }
                "free" => format!("{}", cuMemFree_v2(ptrs[num(1) as usize])),
                "asyncfree" => format!("{}", cuMemFreeAsync(ptrs[num(1) as usize], 0)),
                "sync" => format!("{}", cuCtxSynchronize()),
                "info" => {
                    let (mut f, mut t) = (0, 0);
                    let rc = cuMemGetInfo_v2(&mut f, &mut t);
                    format!("{rc} {f} {t}")
                }
                // Bytes this process holds on ordinal D (its ledger).
                "mine" => format!("{}", ledger().unwrap().stats(num(1) as usize).used),
                "uuid" | "uuid2" => {
                    let mut u = [0u8; 16];
                    let rc = if w[0] == "uuid" {
                        cuDeviceGetUuid(&mut u, dev(1))
                    } else {
                        cuDeviceGetUuid_v2(&mut u, dev(1))
                    };
                    format!("{rc} {}", hex(&u))
                }
                "name" | "pci" => {
                    let mut b = [0i8; 96];
                    let rc = if w[0] == "name" {
                        cuDeviceGetName(b.as_mut_ptr(), 96, dev(1))
                    } else {
                        cuDeviceGetPCIBusId(b.as_mut_ptr(), 96, dev(1))
                    };
                    format!("{rc} {}", cstr(b.as_ptr()).unwrap_or(""))
                }
                "write" => {
                    let v = num(3) as u32;
                    let rc = cuMemcpyHtoD_v2(
                        ptrs[num(1) as usize] + num(2),
                        (&v as *const u32).cast(),
                        4,
                    );
                    format!("{rc}")
                }
                "read" => {
                    let mut v = 0u32;
                    let rc = cuMemcpyDtoH_v2(
                        (&mut v as *mut u32).cast(),
                        ptrs[num(1) as usize] + num(2),
                        4,
                    );
                    format!("{rc} {v}")
                }
                "ipcget" => {
                    let mut h = CUipcMemHandle { reserved: [0; 64] };
                    let rc = cuIpcGetMemHandle(&mut h, ptrs[num(1) as usize]);
                    format!("{rc} {}", hex(&h.reserved))
                }
                "ipcopen" => {
                    let mut h = CUipcMemHandle { reserved: [0; 64] };
                    h.reserved.copy_from_slice(&unhex(w[1]));
                    let mut p = 0;
                    let rc = cuIpcOpenMemHandle_v2(&mut p, h, 1);
                    ptrs.push(p);
                    format!("{rc} {}", ptrs.len() - 1)
                }
                "ipcclose" => format!("{}", cuIpcCloseMemHandle(ptrs[num(1) as usize])),
                "exit" => {
                    // exit() runs the fake's exit handler (stats, shared slot).
                    libc::exit(0);
                }
                other => panic!("unknown shell command {other}"),
            }
        };
        let mut out = std::io::stdout().lock();
        writeln!(out, ">> {answer}").unwrap();
        out.flush().unwrap();
    }
}

struct Shell {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

/// A copy of this test binary that runs `shell` with `env` (and no other FAKECUDA_* variable).
fn shell_command(env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "process_tests::shell",
        "--nocapture",
        "--test-threads=1",
        "-q",
    ]);
    for (k, _) in std::env::vars() {
        if k.starts_with("FAKECUDA_") || k == "CUDA_VISIBLE_DEVICES" {
            cmd.env_remove(k);
        }
    }
    cmd.env("FAKECUDA_TEST_SHELL", "1")
        .envs(env.iter().copied());
    cmd
}

impl Shell {
    fn spawn(env: &[(&str, &str)]) -> Shell {
        let mut child = shell_command(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Shell { child, stdin, out }
    }

    /// Runs one command; its answer.
    fn cmd(&mut self, c: &str) -> String {
        writeln!(self.stdin, "{c}").unwrap();
        self.stdin.flush().unwrap();
        loop {
            let mut line = String::new();
            let n = self.out.read_line(&mut line).unwrap();
            assert!(
                n > 0,
                "shell died running {c:?}: {:?}",
                self.child.try_wait()
            );
            if let Some(a) = line.strip_prefix(">> ") {
                return a.trim_end().to_string();
            }
        }
    }

    /// Runs a command that must succeed; the rest of its answer.
    fn ok(&mut self, c: &str) -> String {
        let a = self.cmd(c);
        let (rc, rest) = a.split_once(' ').unwrap_or((&a, ""));
        assert_eq!(rc, "0", "{c:?} -> {a:?}");
        rest.to_string()
    }

    /// `info`: (free, total).
    fn info(&mut self) -> (u64, u64) {
        let a = self.ok("info");
        let mut it = a.split(' ').map(|x| x.parse::<u64>().unwrap());
        (it.next().unwrap(), it.next().unwrap())
    }

    fn exit(mut self) {
        let _ = writeln!(self.stdin, "exit");
        let _ = self.stdin.flush();
        assert!(self.child.wait().unwrap().success());
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

fn tmp(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("fakecuda-proc-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn stats(path: &PathBuf) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// The number after `"key":` in the `ordinal`-th device of a stats file.
fn stat(json: &str, ordinal: usize, key: &str) -> u64 {
    let dev = json.split("{\"ordinal\":").nth(ordinal + 1).unwrap();
    let at = dev
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("{key} in {json}"));
    dev[at + key.len() + 3..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn shared_mode_processes_share_devices_and_dead_ones_give_back() {
    let path = tmp("shared");
    let shared = path.to_str().unwrap();
    let stats_b = tmp("shared-stats-b");
    let env = [
        ("FAKECUDA_SHARED", shared),
        ("FAKECUDA_DEVICES", "2"),
        ("FAKECUDA_TOTAL_MEM", "4Gi"),
    ];
    let mut a = Shell::spawn(&env);
    let mut benv = env.to_vec();
    benv.push(("FAKECUDA_STATS", stats_b.to_str().unwrap()));
    let mut b = Shell::spawn(&benv);
    for s in [&mut a, &mut b] {
        s.ok("init");
        s.ok("ctx 0");
    }
    for _ in 0..3 {
        a.ok(&format!("alloc {GIB}"));
    }
    assert_eq!(b.info(), (GIB, 4 * GIB), "B sees A's 3 GiB");
    b.ok(&format!("alloc {GIB}"));
    assert_eq!(b.cmd("alloc 1"), "2 1", "the device is full: OUT_OF_MEMORY");
    a.ok("free 0");
    assert_eq!(b.info().0, GIB);
    b.ok(&format!("alloc {GIB}"));
    assert_eq!(a.cmd(&format!("alloc {GIB}")).split(' ').next(), Some("2"));
    assert_eq!(a.info().0, 0);
    // Device 1 is separate.
    a.ok("ctx 1");
    a.ok(&format!("alloc {}", 4 * GIB));
    // A process that sees physical device 1 as its ordinal 0 shares it too.
    let mut cenv = env.to_vec();
    cenv.push(("CUDA_VISIBLE_DEVICES", "1"));
    let mut c = Shell::spawn(&cenv);
    c.ok("init");
    c.ok("ctx 0");
    assert_eq!(c.info().0, 0);
    // A dies without exiting: its 2 GiB on device 0 and 4 GiB on device 1 come back.
    a.kill();
    assert_eq!(b.info().0, 2 * GIB);
    assert_eq!(c.info().0, 4 * GIB);
    b.ok(&format!("alloc {}", 2 * GIB));
    assert_eq!(b.info().0, 0);
    c.exit();
    // A process configured differently cannot join.
    let mut d = Shell::spawn(&[
        ("FAKECUDA_SHARED", shared),
        ("FAKECUDA_DEVICES", "2"),
        ("FAKECUDA_TOTAL_MEM", "8Gi"),
    ]);
    assert_eq!(d.cmd("init"), "1");
    d.exit();
    b.exit();
    // B's stats are its own (3 allocation calls, one refused, 4 GiB peak) and the device's.
    let js = stats(&stats_b);
    assert_eq!(stat(&js, 0, "alloc_calls"), 3, "{js}");
    assert_eq!(stat(&js, 0, "failed_alloc_calls"), 1, "{js}");
    assert_eq!(stat(&js, 0, "peak_used"), 4 * GIB, "{js}");
    assert_eq!(stat(&js, 0, "shared_peak_used"), 4 * GIB, "{js}");
    // Everyone left: the file says nothing is in use.
    let s = fake_gpu::shared::Shared::observe(&path).unwrap().unwrap();
    assert_eq!((s.used(0), s.used(1)), (0, 0));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&stats_b);
}

#[test]
fn context_memory_is_charged_while_contexts_live() {
    let st = tmp("ctxmem-stats");
    let mut s = Shell::spawn(&[
        ("FAKECUDA_CONTEXT_MEM", "300Mi"),
        ("FAKECUDA_TOTAL_MEM", "1Gi"),
        ("FAKECUDA_DEVICES", "2"),
        ("FAKECUDA_STATS", st.to_str().unwrap()),
    ]);
    s.ok("init");
    assert_eq!(s.cmd("mine 0"), "0");
    s.ok("ctx 0");
    assert_eq!(s.info(), (GIB - 300 * MIB, GIB));
    s.ok("ctx 0"); // a second retain of the same primary context costs nothing
    assert_eq!(s.cmd("mine 0"), format!("{}", 300 * MIB));
    s.ok("create 0");
    assert_eq!(s.info().0, GIB - 600 * MIB);
    s.ok("create 0");
    assert_eq!(s.cmd("create 0"), "2", "a fourth context does not fit");
    s.ok("destroy");
    assert_eq!(s.cmd("mine 0"), format!("{}", 600 * MIB));
    s.ok("release 0");
    assert_eq!(
        s.cmd("mine 0"),
        format!("{}", 600 * MIB),
        "still retained once"
    );
    s.ok("release 0");
    assert_eq!(s.cmd("mine 0"), format!("{}", 300 * MIB));
    s.ok("destroy");
    assert_eq!(s.cmd("mine 0"), "0");
    s.ok("ctx 0");
    s.ok("reset 0");
    assert_eq!(s.cmd("mine 0"), "0");
    s.ok("ctx 1");
    s.exit();
    let js = stats(&st);
    assert_eq!(stat(&js, 0, "peak_used"), 900 * MIB, "{js}");
    assert_eq!(stat(&js, 0, "alloc_calls"), 0, "{js}");
    assert_eq!(stat(&js, 0, "context_mem"), 0, "{js}");
    assert_eq!(stat(&js, 1, "context_mem"), 300 * MIB, "{js}");
    assert_eq!(stat(&js, 1, "final_used"), 300 * MIB, "{js}");
    let _ = std::fs::remove_file(&st);
}

#[test]
fn visible_devices_and_mig_identity() {
    let mut s = Shell::spawn(&[
        ("FAKECUDA_DEVICES", "4"),
        (
            "CUDA_VISIBLE_DEVICES",
            "2,GPU-face0000-0000-0000-0000-000000000000,9,1",
        ),
    ]);
    s.ok("init");
    assert_eq!(s.ok("count"), "2");
    assert_eq!(s.ok("uuid 0"), hex(&fake_gpu::identity::gpu_uuid(2)));
    assert_eq!(s.ok("uuid2 1"), hex(&fake_gpu::identity::gpu_uuid(0)));
    assert_eq!(s.ok("pci 0"), "00000000:03:00.0");
    assert_eq!(s.ok("name 0"), "FakeCUDA Device 2");
    assert_eq!(s.cmd("uuid 2"), format!("101 {}", hex(&[0; 16])));
    s.exit();

    let mut m = Shell::spawn(&[
        ("FAKECUDA_DEVICES", "2"),
        ("FAKECUDA_MIG", "1"),
        ("FAKECUDA_TOTAL_MEM", "40Gi"),
        (
            "CUDA_VISIBLE_DEVICES",
            "MIG-face0001-0000-0000-0000-000000000001",
        ),
    ]);
    m.ok("init");
    assert_eq!(m.ok("count"), "1");
    assert_eq!(m.ok("uuid2 0"), hex(&fake_gpu::identity::mig_uuid(1)));
    assert_eq!(
        m.ok("uuid 0"),
        hex(&fake_gpu::identity::gpu_uuid(1)),
        "v1 names the parent GPU"
    );
    assert_eq!(m.ok("name 0"), "FakeCUDA Device 1 MIG 7g.40gb");
    m.exit();

    let mut none = Shell::spawn(&[("CUDA_VISIBLE_DEVICES", "")]);
    none.ok("init");
    assert_eq!(none.ok("count"), "0");
    assert_eq!(none.cmd("ctx 0"), "101");
    none.exit();
}

#[test]
fn ipc_between_processes() {
    let mut a = Shell::spawn(&[]);
    let mut b = Shell::spawn(&[]);
    for s in [&mut a, &mut b] {
        s.ok("init");
        s.ok("ctx 0");
    }
    a.ok(&format!("alloc {}", 64 * MIB));
    a.ok("write 0 4096 31337");
    let h = a.ok("ipcget 0");
    let i = b.ok(&format!("ipcopen {h}"));
    assert_eq!(b.ok(&format!("read {i} 4096")), "31337");
    b.ok(&format!("write {i} 8 99"));
    assert_eq!(a.ok("read 0 8"), "99");
    assert_eq!(b.cmd("mine 0"), "0", "the importer is not charged");
    b.ok(&format!("ipcclose {i}"));
    a.ok("free 0");
    assert_eq!(
        b.cmd(&format!("ipcopen {h}")).split(' ').next(),
        Some("1"),
        "freed"
    );
    a.exit();
    b.exit();
}

#[test]
fn pools_keep_reserved_memory_visible_to_other_processes() {
    let path = tmp("poolshared");
    let env = [
        ("FAKECUDA_SHARED", path.to_str().unwrap()),
        ("FAKECUDA_TOTAL_MEM", "1Gi"),
    ];
    let mut a = Shell::spawn(&env);
    let mut b = Shell::spawn(&env);
    for s in [&mut a, &mut b] {
        s.ok("init");
        s.ok("ctx 0");
    }
    a.ok(&format!("asyncalloc {}", 600 * MIB));
    a.ok("asyncfree 0");
    assert_eq!(b.info().0, 424 * MIB, "freed to the pool: still reserved");
    assert_eq!(
        b.cmd(&format!("alloc {}", 500 * MIB)).split(' ').next(),
        Some("2")
    );
    a.ok("sync");
    assert_eq!(b.info().0, GIB);
    b.ok(&format!("alloc {}", 500 * MIB));
    a.exit();
    b.exit();
    let _ = std::fs::remove_file(&path);
}

/// cuCtxDetach to zero gives the context back as cuCtxDestroy / the last primary release do:
/// its context memory and its allocations.
#[test]
fn detaching_the_last_usage_gives_the_context_back() {
    let st = tmp("detach-stats");
    let mut s = Shell::spawn(&[
        ("FAKECUDA_CONTEXT_MEM", "300Mi"),
        ("FAKECUDA_TOTAL_MEM", "1Gi"),
        ("FAKECUDA_STATS", st.to_str().unwrap()),
    ]);
    s.ok("init");
    assert_eq!(s.cmd("attach"), "201", "no current context");
    // The primary context, retained once: attach makes it twice.
    s.ok("ctx 0");
    s.ok("attach");
    s.ok(&format!("alloc {}", 100 * MIB));
    s.ok("detach");
    assert_eq!(s.cmd("state 0"), "0 1");
    assert_eq!(s.cmd("mine 0"), format!("{}", 400 * MIB));
    s.ok("detach");
    assert_eq!(s.cmd("state 0"), "0 0", "released to zero");
    assert_eq!(
        s.cmd("mine 0"),
        "0",
        "its memory and its allocation are given back"
    );
    assert_eq!(s.cmd("detach"), "201");
    // A created context: 1 usage, 2 after attach.
    s.ok("create 0");
    s.ok("attach");
    s.ok(&format!("alloc {}", 100 * MIB));
    s.ok("detach");
    assert_eq!(s.cmd("mine 0"), format!("{}", 400 * MIB));
    s.ok("detach");
    assert_eq!(s.cmd("mine 0"), "0");
    assert_eq!(s.cmd("detach"), "201", "destroyed");
    assert_eq!(
        s.cmd(&format!("alloc {}", MIB)).split(' ').next(),
        Some("201"),
        "and popped"
    );
    s.exit();
    let js = stats(&st);
    assert_eq!(stat(&js, 0, "peak_used"), 400 * MIB, "{js}");
    assert_eq!(stat(&js, 0, "context_mem"), 0, "{js}");
    assert_eq!(stat(&js, 0, "final_used"), 0, "{js}");
    let _ = std::fs::remove_file(&st);
}

/// What the fake knows follows FAKECUDA_DRIVER_VERSION: CUDA 13.2's pool location
/// attributes, 13.4's locality domain, cuProfilerInitialize's NOT_SUPPORTED since 12.0.
#[test]
fn the_driver_version_decides_what_the_fake_knows() {
    // (version, cuProfilerInitialize, LOCATION_ID, LOCATION_TYPE, LOCALITY_DOMAIN_ID)
    let cases = [
        (None, "801", "0 2", "0 1", "0 -1"),
        (Some("11080"), "0", "1 21845", "1 21845", "1 21845"),
        (Some("12090"), "801", "1 21845", "1 21845", "1 21845"),
        (Some("13010"), "801", "1 21845", "1 21845", "1 21845"),
        (Some("13020"), "801", "0 2", "0 1", "1 21845"),
        (Some("13040"), "801", "0 2", "0 1", "0 -1"),
    ];
    for (version, profinit, id, ty, locality) in cases {
        let mut env = vec![("FAKECUDA_DEVICES", "3")];
        env.extend(version.map(|v| ("FAKECUDA_DRIVER_VERSION", v)));
        let mut s = Shell::spawn(&env);
        s.ok("init");
        let want = version.unwrap_or("13050");
        assert_eq!(s.ok("version"), want, "the default is CUDA 13.5");
        assert_eq!(s.cmd("profinit"), profinit, "{version:?}");
        assert_eq!(s.cmd("poolattr 2 11"), id, "{version:?}");
        assert_eq!(s.cmd("poolattr 2 12"), ty, "{version:?}");
        assert_eq!(s.cmd("poolattr 2 15"), locality, "{version:?}");
        s.exit();
    }
}

/// A pool's own device has READWRITE access; others get what cuMemPoolSetAccess grants.
#[test]
fn pool_access_of_other_devices() {
    let mut s = Shell::spawn(&[("FAKECUDA_DEVICES", "3")]);
    s.ok("init");
    assert_eq!(s.cmd("poolaccess 1 1"), "0 3");
    assert_eq!(s.cmd("poolaccess 1 0"), "0 0", "not granted");
    assert_eq!(s.cmd("poolaccess 1 3"), "1 -1", "no such device");
    s.ok("poolgrant 1 0 1");
    assert_eq!(s.cmd("poolaccess 1 0"), "0 1");
    s.ok("poolgrant 1 0 3");
    assert_eq!(s.cmd("poolaccess 1 0"), "0 3");
    assert_eq!(s.cmd("poolaccess 1 2"), "0 0", "per device");
    assert_eq!(s.cmd("poolaccess 0 0"), "0 3", "per pool");
    assert_eq!(s.cmd("poolaccess 0 1"), "0 0");
    s.ok("poolgrant 1 0 0");
    assert_eq!(s.cmd("poolaccess 1 0"), "0 0", "revoked");
    assert_eq!(s.cmd("poolgrant 1 1 0"), "1", "the owner keeps READWRITE");
    assert_eq!(
        s.cmd("poolgrant 1 0 2"),
        "1",
        "not a CUmemAccess_flags value"
    );
    assert_eq!(s.cmd("poolgrant 1 5 3"), "1", "no such device");
    assert_eq!(s.cmd("poolaccess 1 1"), "0 3");
    s.exit();
}

/// FAKECUDA_TRACE=1: one `fakecuda:` line per call with its name, its arguments (sizes in
/// decimal, pointers in hex), its result by name and, in brackets, what it handed out.
#[test]
fn trace_lines_name_the_call_its_arguments_and_result() {
    let mut child = shell_command(&[("FAKECUDA_TRACE", "1")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"init\nctx 0\nalloc 4096\nalloc 0\nfree 0\nexit\n")
        .unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    let lines: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("fakecuda: "))
        .collect();
    let find = |name: &str| -> Vec<&str> {
        lines
            .iter()
            .copied()
            .filter(|l| l.starts_with(&format!("{name}(")))
            .collect()
    };
    assert_eq!(
        find("cuInit"),
        ["cuInit(flags=0) -> CUDA_SUCCESS"],
        "{stderr}"
    );
    let retain = find("cuDevicePrimaryCtxRetain");
    assert_eq!(retain.len(), 1, "{stderr}");
    assert!(
        retain[0].starts_with("cuDevicePrimaryCtxRetain(pctx=0x"),
        "{stderr}"
    );
    assert!(
        retain[0].contains(", dev=0) -> CUDA_SUCCESS [ctx=0x"),
        "{stderr}"
    );
    let allocs = find("cuMemAlloc_v2");
    assert_eq!(allocs.len(), 2, "{stderr}");
    let ok = allocs[0];
    assert!(ok.starts_with("cuMemAlloc_v2(dptr=0x"), "{ok}");
    assert!(
        ok.contains(", bytesize=4096) -> CUDA_SUCCESS [ptr=0x"),
        "{ok}"
    );
    assert!(ok.ends_with(']'), "{ok}");
    assert!(
        allocs[1].ends_with(", bytesize=0) -> CUDA_ERROR_INVALID_VALUE"),
        "{}",
        allocs[1]
    );
    let free = find("cuMemFree_v2");
    assert_eq!(free.len(), 1, "{stderr}");
    let ptr = &ok[ok.find("[ptr=").unwrap() + 5..ok.len() - 1];
    assert_eq!(free[0], format!("cuMemFree_v2(dptr={ptr}) -> CUDA_SUCCESS"));
}
