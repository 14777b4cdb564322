//! The keys of every per-GPU variable, and a pool's guarantees and ceilings, checked
//! against the GPUs the driver lists, as the shim checks them at `cuInit`: `check` and
//! `run` refuse what the library would, with its line.

use gpucap_core::config::Config;

use crate::driver::Device;

/// Checks the keys of every per-GPU variable of `config` against the GPUs the driver
/// listed, with the shim's own check at `cuInit` (`config::check_gpu_keys`): the error
/// is the very line the shim would print (`gpucap: GPUCAP_GUARANTEE names GPU 1, but
/// only 1 GPU is visible ...; accepted keys: 0 or GPU-…`).
///
/// In a pool, each GPU's guarantee and ceiling are then checked against its cap with
/// the very function the shim claims them with when it joins (`budget::shares::for_gpu`):
/// what the library would refuse at `cuInit` is refused here, before anything (a
/// program, a pool file) is started or made.
pub fn key_check(config: &Config, devices: &[Device]) -> Result<(), String> {
    let uuids: Option<Vec<[u8; 16]>> = devices.iter().map(|d| d.uuid).collect();
    gpucap_core::config::check_gpu_keys(config, Some(devices.len()), || uuids.as_deref())?;
    let Some(pool) = &config.pool else {
        return Ok(());
    };
    let all: Vec<[u8; 16]> = devices.iter().map(|d| d.uuid.unwrap_or_default()).collect();
    for d in devices {
        let cap = config
            .limit
            .as_ref()
            .and_then(|l| l.for_device(d.ordinal, d.uuid.as_ref()))
            .map(|l| l.resolve(d.total));
        gpucap_core::budget::shares::for_gpu(config, d.ordinal as usize, &all, cap)
            .map_err(|e| format!("gpucap: pool {pool}: GPU {}: {e}", d.ordinal))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{GI, dev, limited};

    #[test]
    fn keys_past_the_visible_gpus_are_errors() {
        let two = [dev(0, 80 * GI), dev(1, 80 * GI)];
        assert_eq!(key_check(&limited("4Gi,1=1Gi"), &two), Ok(()));
        assert_eq!(key_check(&limited("4Gi"), &[]), Ok(()));
        let e = key_check(&limited("4Gi,5=1Gi"), &two).unwrap_err();
        assert_eq!(
            e,
            "gpucap: GPUCAP_LIMIT names GPU 5, but only 2 GPUs are visible to CUDA (GPU 0 to \
             GPU 1); ordinals count the GPUs CUDA_VISIBLE_DEVICES leaves visible, from 0; \
             accepted keys: 0 to 1 (the driver could not list the GPUs' UUIDs)"
        );
        let e = key_check(&limited("0=1Gi"), &[]).unwrap_err();
        assert!(
            e.starts_with("gpucap: GPUCAP_LIMIT names GPU 0, but no GPU is visible to CUDA;"),
            "{e}"
        );
        // A UUID key needs every visible GPU's UUID.
        let u = "GPU-face0000-0000-0000-0000-000000000001";
        let e = key_check(&limited(&format!("{u}=1Gi")), &two).unwrap_err();
        assert!(e.contains("could not list the UUIDs"), "{e}");
        // The keys of a guarantee and a ceiling are checked the same way.
        for var in ["GPUCAP_GUARANTEE", "GPUCAP_CEILING"] {
            let config =
                gpucap_core::config::from_vars([("GPUCAP_POOL", "p"), (var, "5=1Gi")]).unwrap();
            let e = key_check(&config, &two).unwrap_err();
            assert!(e.starts_with(&format!("gpucap: {var} names GPU 5")), "{e}");
        }
    }
}
