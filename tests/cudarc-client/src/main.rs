//! A small, ordinary CUDA program written against cudarc's safe driver API. It knows
//! nothing about gpucap: the end-to-end tests and `scripts/demo.sh` run it under the
//! shim and read what it prints.
//!
//! Usage: `cudarc-client [STEP...]` where each STEP is
//!   `<MiB>`  allocate that many MiB (kept until exit), write a pattern, read it back
//!   `free`   release the most recent allocation still held
//!   `info`   print the memory information again
//!   `sleep:<seconds>`  hold what is allocated that long (`sleep` done, then go on)
//!
//! Output, one fact per line:
//!   `device 0 total_mem=<bytes>`          cuDeviceTotalMem
//!   `mem_get_info free=<bytes> total=<bytes>`  cuMemGetInfo (before the steps and after)
//!   `alloc <MiB> ok`  /  `alloc <MiB> err <CUresult name>`
//!   `free <MiB> ok`
//!   `done`
//! Exit status: 0 when every step ran (refused allocations included), 1 when data read
//! back differs from what was written or an unexpected call failed, 2 on bad arguments,
//! 3 when the driver could not be initialised (`init err <CUresult name>`, or
//! `init err no-libcuda` when there is no libcuda.so.1 to load).

use std::process::ExitCode;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DriverError};

const MIB: usize = 1 << 20;
/// Bytes written and read back at each end of an allocation.
const PROBE: usize = MIB;

fn name(e: &DriverError) -> String {
    format!("{:?}", e.0)
}

fn info(ctx: &CudaContext) -> Result<(), DriverError> {
    let (free, total) = ctx.mem_get_info()?;
    println!("mem_get_info free={free} total={total}");
    Ok(())
}

/// Fills the first and last `PROBE` bytes with a pattern particular to this
/// allocation and reads them back, plus a byte in the middle that must still be zero.
fn roundtrip(
    stream: &Arc<CudaStream>,
    buf: &mut CudaSlice<u8>,
    seed: u8,
) -> Result<bool, DriverError> {
    let len = buf.len();
    let n = PROBE.min(len);
    let mut ok = true;
    for start in [0, len - n] {
        let pattern: Vec<u8> = (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect();
        stream.memcpy_htod(&pattern, &mut buf.slice_mut(start..start + n))?;
        let back = stream.clone_dtoh(&buf.slice(start..start + n))?;
        ok &= back == pattern;
    }
    if len > 2 * n {
        let mid = stream.clone_dtoh(&buf.slice(len / 2..len / 2 + 1))?;
        ok &= mid == [0];
    }
    Ok(ok)
}

/// The seconds of a `sleep:<seconds>` step (0 to 3600).
fn sleep_secs(step: &str) -> Option<f64> {
    let secs: f64 = step.strip_prefix("sleep:")?.parse().ok()?;
    (0.0..=3600.0).contains(&secs).then_some(secs)
}

fn main() -> ExitCode {
    let steps: Vec<String> = std::env::args().skip(1).collect();
    for s in &steps {
        if s != "free" && s != "info" && s.parse::<usize>().is_err() && sleep_secs(s).is_none() {
            eprintln!(
                "cudarc-client: bad step {s:?}; expected <MiB>, `free`, `info` or `sleep:<seconds>`"
            );
            return ExitCode::from(2);
        }
    }
    // cudarc panics when it cannot load libcuda at all: one line, no backtrace.
    std::panic::set_hook(Box::new(|info| eprintln!("cudarc-client: {info}")));
    let ctx = match std::panic::catch_unwind(|| CudaContext::new(0)) {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            println!("init err {}", name(&e));
            return ExitCode::from(3);
        }
        Err(_) => {
            println!("init err no-libcuda");
            return ExitCode::from(3);
        }
    };
    match run(&ctx, &steps) {
        Ok(true) => {
            println!("done");
            ExitCode::SUCCESS
        }
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            println!("unexpected err {}", name(&e));
            ExitCode::from(1)
        }
    }
}

fn run(ctx: &Arc<CudaContext>, steps: &[String]) -> Result<bool, DriverError> {
    println!("device 0 total_mem={}", ctx.total_mem()?);
    info(ctx)?;
    let stream = ctx.default_stream();
    let mut held: Vec<(usize, CudaSlice<u8>)> = Vec::new();
    let mut all_ok = true;
    for step in steps {
        match step.as_str() {
            "info" => info(ctx)?,
            s if sleep_secs(s).is_some() => {
                std::thread::sleep(std::time::Duration::from_secs_f64(
                    sleep_secs(s).expect("checked"),
                ));
                println!("sleep done");
            }
            "free" => match held.pop() {
                Some((mib, buf)) => {
                    drop(buf);
                    stream.synchronize()?;
                    println!("free {mib} ok");
                }
                None => println!("free none"),
            },
            n => {
                let mib: usize = n.parse().expect("checked");
                match stream.alloc_zeros::<u8>(mib * MIB) {
                    Ok(mut buf) => {
                        if mib == 0 || roundtrip(&stream, &mut buf, held.len() as u8)? {
                            println!("alloc {mib} ok");
                        } else {
                            println!("alloc {mib} data-mismatch");
                            all_ok = false;
                        }
                        held.push((mib, buf));
                    }
                    Err(e) => println!("alloc {mib} err {}", name(&e)),
                }
            }
        }
    }
    stream.synchronize()?;
    info(ctx)?;
    drop(held);
    stream.synchronize()?;
    Ok(all_ok)
}
