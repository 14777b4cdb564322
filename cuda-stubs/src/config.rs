//! FAKECUDA_* environment variables, read once.

use once_cell::sync::Lazy;

use crate::size::parse_size;

#[derive(Debug, Clone)]
pub struct Config {
    /// FAKECUDA_DEVICES: number of devices (default 1).
    pub devices: usize,
    /// FAKECUDA_TOTAL_MEM: memory of each device in bytes (default 80Gi).
    pub total_mem: u64,
    /// FAKECUDA_DRIVER_VERSION: what cuDriverGetVersion reports (default 12080).
    pub driver_version: i32,
    /// FAKECUDA_STATS: where the exit-time stats JSON goes.
    pub stats_path: Option<std::path::PathBuf>,
}

pub const DEFAULT_TOTAL_MEM: u64 = 80 << 30;
pub const DEFAULT_DRIVER_VERSION: i32 = 12080;

static CONFIG: Lazy<Result<Config, String>> = Lazy::new(|| from_env(|k| std::env::var(k).ok()));

/// The configuration, or the message naming the invalid variable.
pub fn get() -> Result<&'static Config, &'static str> {
    CONFIG.as_ref().map_err(|e| e.as_str())
}

pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
    let devices = match var("FAKECUDA_DEVICES") {
        None => 1,
        Some(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| n <= 64)
            .ok_or_else(|| {
                format!("invalid FAKECUDA_DEVICES={v:?}: expected a whole number from 0 to 64")
            })?,
    };
    let total_mem = match var("FAKECUDA_TOTAL_MEM") {
        None => DEFAULT_TOTAL_MEM,
        Some(v) => {
            parse_size(v.trim()).map_err(|e| format!("invalid FAKECUDA_TOTAL_MEM={v:?}: {e}"))?
        }
    };
    let driver_version = match var("FAKECUDA_DRIVER_VERSION") {
        None => DEFAULT_DRIVER_VERSION,
        Some(v) => v
            .trim()
            .parse::<i32>()
            .ok()
            .filter(|&n| n >= 2000)
            .ok_or_else(|| {
                format!("invalid FAKECUDA_DRIVER_VERSION={v:?}: expected a CUDA version number like 12080")
            })?,
    };
    let stats_path = var("FAKECUDA_STATS")
        .filter(|v| !v.is_empty())
        .map(Into::into);
    Ok(Config {
        devices,
        total_mem,
        driver_version,
        stats_path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| pairs.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn defaults() {
        let c = from_env(env(&[])).unwrap();
        assert_eq!(
            (c.devices, c.total_mem, c.driver_version),
            (1, 80 << 30, 12080)
        );
        assert!(c.stats_path.is_none());
    }

    #[test]
    fn parses_values() {
        let c = from_env(env(&[
            ("FAKECUDA_DEVICES", "4"),
            ("FAKECUDA_TOTAL_MEM", "1.5Gi"),
            ("FAKECUDA_DRIVER_VERSION", "13000"),
        ]))
        .unwrap();
        assert_eq!(
            (c.devices, c.total_mem, c.driver_version),
            (4, 3 << 29, 13000)
        );
    }

    #[test]
    fn invalid_values_name_the_variable() {
        for (k, v) in [
            ("FAKECUDA_DEVICES", "x"),
            ("FAKECUDA_TOTAL_MEM", "lots"),
            ("FAKECUDA_DRIVER_VERSION", "12.8"),
        ] {
            let err = from_env(env(&[(k, v)])).unwrap_err();
            assert!(err.contains(k), "{err}");
        }
    }
}
