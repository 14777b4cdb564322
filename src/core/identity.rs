//! Device identity: which CUDA ordinal a UUID names.
//!
//! CUDA numbers the devices a process sees after `CUDA_VISIBLE_DEVICES` (given as
//! indices, `GPU-…` or `MIG-…` UUIDs; the driver applies it); NVML numbers them by
//! physical index and ignores it. Neither index can be turned into the other by
//! arithmetic, so every mapping goes through the UUID: `cuDeviceGetUuid_v2` of each
//! visible CUDA ordinal, read once, against the UUID a `GPUCAP_LIMIT` key or
//! `nvmlDeviceGetUUID` names. The 16 bytes are compared, so `GPU-…` and `MIG-…`
//! spellings do not matter (a MIG instance's CUDA UUID is its `MIG-…` UUID).
//!
//! A key of any per-GPU variable that matches no visible device (a UUID that is not
//! visible, an ordinal past the visible GPUs) is an error (`config::check_gpu_keys`, the
//! check `gpucap check`/`run` make too): `cuInit` fails with `CUDA_ERROR_NOT_PERMITTED`
//! and a message naming the key, and so does every later call (fail closed, as for an
//! invalid configuration); [`latch`] keeps the message.

use std::sync::OnceLock;

use crate::config::{DeviceUuid, Limit, LimitSpec};

/// The UUIDs of the visible CUDA devices, by ordinal (None: the driver did not answer).
static VISIBLE: OnceLock<Option<Vec<[u8; 16]>>> = OnceLock::new();

/// Set when the GPU keys did not match the visible devices: the message.
#[cfg_attr(test, allow(dead_code))]
static FAILED: OnceLock<String> = OnceLock::new();

/// The UUIDs of the visible CUDA devices, by ordinal, asked of the driver once
/// (`query` calls `cuInit(0)`, which is idempotent; the NVML hooks ask only once the
/// program initialised CUDA itself, and otherwise never initialise it: see `nvml`).
pub fn visible(query: impl FnOnce() -> Option<Vec<[u8; 16]>>) -> Option<&'static [[u8; 16]]> {
    VISIBLE.get_or_init(query).as_deref()
}

/// The CUDA ordinal whose UUID is `uuid`.
pub fn ordinal_of(visible: &[[u8; 16]], uuid: &[u8; 16]) -> Option<usize> {
    visible.iter().position(|u| u == uuid)
}

/// The bytes of a UUID as NVML prints it (`GPU-…`, `MIG-…`).
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    DeviceUuid::parse(text.trim()).ok().map(|u| u.bytes)
}

/// Remembers that the keys did not match: every later call fails closed.
#[cfg_attr(test, allow(dead_code))]
pub fn latch(msg: String) -> &'static str {
    FAILED.get_or_init(|| msg).as_str()
}

/// The message, once the GPU keys were found not to match the devices.
#[cfg_attr(test, allow(dead_code))]
pub fn failed() -> Option<&'static str> {
    FAILED.get().map(String::as_str)
}

/// The limit of `device` under `spec`: UUID keys need the visible devices' UUIDs
/// (only asked for when the spec has such keys). Fails closed: if they are needed and
/// cannot be read, the device gets a cap of 0.
pub fn limit_for(
    spec: &LimitSpec,
    device: usize,
    query: impl FnOnce() -> Option<Vec<[u8; 16]>>,
) -> Option<Limit> {
    if spec.uuid_keys().next().is_none() {
        return spec.for_ordinal(device as u32);
    }
    limit_among(spec, device, visible(query))
}

fn limit_among(spec: &LimitSpec, device: usize, visible: Option<&[[u8; 16]]>) -> Option<Limit> {
    match visible {
        Some(v) => spec.for_device(device as u32, v.get(device)),
        None => Some(Limit::Bytes(0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{check_var_keys, parse_limit_spec};

    fn check_keys_of<'a>(
        spec: &LimitSpec,
        count: Option<usize>,
        visible: impl FnOnce() -> Option<&'a [[u8; 16]]>,
    ) -> Result<(), String> {
        check_var_keys("GPUCAP_LIMIT", spec, count, visible)
    }

    const GI: u64 = 1 << 30;

    fn uuid(n: u8) -> [u8; 16] {
        let mut u = [0u8; 16];
        u[0] = 0xfa;
        u[1] = 0xce;
        u[15] = n;
        u
    }

    #[test]
    fn maps_by_uuid_never_by_index() {
        // CUDA_VISIBLE_DEVICES=2,0: ordinal 0 is physical GPU 2.
        let visible = [uuid(2), uuid(0)];
        assert_eq!(ordinal_of(&visible, &uuid(2)), Some(0));
        assert_eq!(ordinal_of(&visible, &uuid(0)), Some(1));
        assert_eq!(
            ordinal_of(&visible, &uuid(1)),
            None,
            "physical GPU 1 is not visible"
        );
        assert_eq!(
            parse_uuid("GPU-face0000-0000-0000-0000-000000000002"),
            Some(uuid(2))
        );
        assert_eq!(
            parse_uuid(" MIG-face0000-0000-0000-0000-000000000002\n"),
            Some(uuid(2))
        );
        assert_eq!(parse_uuid("GPU-nonsense"), None);
    }

    #[test]
    fn limits_by_uuid_key() {
        let spec = parse_limit_spec("GPU-face0000-0000-0000-0000-000000000002=1Gi").unwrap();
        let visible = [uuid(2), uuid(0)];
        assert_eq!(
            limit_among(&spec, 0, Some(&visible)),
            Some(Limit::Bytes(GI))
        );
        assert_eq!(limit_among(&spec, 1, Some(&visible)), None);
        assert_eq!(
            limit_among(&spec, 0, None),
            Some(Limit::Bytes(0)),
            "fails closed"
        );
        assert!(check_keys_of(&spec, Some(2), || Some(&visible)).is_ok());
        // Without UUID keys the driver is never asked for UUIDs.
        let plain = parse_limit_spec("1=2Gi").unwrap();
        assert_eq!(
            limit_for(&plain, 1, || panic!("not asked")),
            Some(Limit::Bytes(2 * GI))
        );
        assert!(check_keys_of(&plain, Some(2), || panic!("not asked")).is_ok());
    }

    #[test]
    fn an_unmatched_key_is_an_error_naming_it() {
        let spec = parse_limit_spec("4Gi,MIG-face0000-0000-0000-0000-000000000009=1Gi").unwrap();
        let one = [uuid(0)];
        let e = check_keys_of(&spec, Some(1), || Some(&one)).unwrap_err();
        assert!(
            e.starts_with("gpucap: GPUCAP_LIMIT names MIG-face0000-0000-0000-0000-000000000009"),
            "{e}"
        );
        let e = check_keys_of(&spec, Some(1), || None).unwrap_err();
        assert!(e.contains("could not list the UUIDs"), "{e}");
    }

    #[test]
    fn an_ordinal_past_the_visible_gpus_is_an_error_naming_it() {
        // CUDA_VISIBLE_DEVICES=1: one GPU visible, so `1=2Gi` would cap nothing.
        let spec = parse_limit_spec("0=1Gi,1=2Gi").unwrap();
        // The UUIDs are asked for to list what is accepted.
        let e = check_keys_of(&spec, Some(1), || None).unwrap_err();
        assert!(
            e.starts_with("gpucap: GPUCAP_LIMIT names GPU 1, but only 1 GPU is visible"),
            "{e}"
        );
        assert!(check_keys_of(&spec, Some(2), || panic!("not asked")).is_ok());
        let e = check_keys_of(&spec, None, || panic!("not asked")).unwrap_err();
        assert!(e.contains("could not say how many"), "{e}");
        // A default alone names no GPU: nothing to check, even without a count.
        assert!(check_keys_of(&parse_limit_spec("4Gi").unwrap(), None, || None).is_ok());
    }
}
