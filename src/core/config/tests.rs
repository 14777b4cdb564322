//! Unit and property tests of the configuration parsers.

#[allow(clippy::module_inception)]
mod tests {
    use super::super::*;
    use crate::config::file::parse_env_file;
    use crate::config::hami::hami_spec;
    use crate::config::vars::{
        GROWTH_ACCEPTED, KNOWN_VARS, LD_SO_PRELOAD_ACCEPTED, parse_log_level,
    };
    use std::ffi::{OsStr, OsString};
    use std::os::unix::ffi::OsStrExt;
    use std::path::PathBuf;

    const GI: u64 = 1 << 30;

    fn spec(s: &str) -> LimitSpec {
        parse_limit_spec(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    fn single(s: &str) -> Limit {
        let sp = spec(s);
        assert!(sp.devices.is_empty());
        sp.default.unwrap()
    }

    fn spec_err(s: &str) -> String {
        parse_limit_spec(s).expect_err(s)
    }

    #[test]
    fn single_values() {
        assert_eq!(single("8Gi"), Limit::Bytes(8 * GI));
        assert_eq!(single("512MiB"), Limit::Bytes(512 << 20));
        assert_eq!(single("1073741824"), Limit::Bytes(GI));
        // A plain integer is bytes, at least 1 MiB of them; a unit says bytes on purpose.
        assert_eq!(single("1048576"), Limit::Bytes(1 << 20));
        assert_eq!(single("1B"), Limit::Bytes(1));
        assert_eq!(single("8B"), Limit::Bytes(8));
        assert_eq!(single("1.5Gi"), Limit::Bytes(1_610_612_736));
        assert_eq!(single("4G"), Limit::Bytes(4_000_000_000));
        assert_eq!(single("50%"), Limit::Fraction(0.5));
        assert_eq!(single("12.5%"), Limit::Fraction(0.125));
        assert_eq!(single("100%"), Limit::Fraction(1.0));
        assert_eq!(single("0.5"), Limit::Fraction(0.5));
        assert_eq!(single(".25"), Limit::Fraction(0.25));
        assert_eq!(single("1.0"), Limit::Fraction(1.0));
        assert_eq!(single("  8Gi  "), Limit::Bytes(8 * GI));
    }

    #[test]
    fn lists() {
        assert_eq!(
            spec("0=8Gi,1=50%"),
            LimitSpec {
                default: None,
                devices: vec![
                    (DeviceKey::Ordinal(0), Limit::Bytes(8 * GI)),
                    (DeviceKey::Ordinal(1), Limit::Fraction(0.5)),
                ],
                from: LimitFrom::Gpucap,
            }
        );
        assert_eq!(
            spec("4Gi,1=8Gi"),
            LimitSpec {
                default: Some(Limit::Bytes(4 * GI)),
                devices: vec![(DeviceKey::Ordinal(1), Limit::Bytes(8 * GI))],
                from: LimitFrom::Gpucap,
            }
        );
        // The default may come anywhere; whitespace is trimmed everywhere.
        assert_eq!(spec(" 1 = 8Gi , 4Gi "), spec("4Gi,1=8Gi"));
        assert_eq!(
            spec("63=1Gi").devices,
            vec![(DeviceKey::Ordinal(63), Limit::Bytes(GI))]
        );
        assert_eq!(spec("0=0.25").devices[0].1, Limit::Fraction(0.25));
    }

    #[test]
    fn for_ordinal() {
        let s = spec("4Gi,1=8Gi");
        assert_eq!(s.for_ordinal(0), Some(Limit::Bytes(4 * GI)));
        assert_eq!(s.for_ordinal(1), Some(Limit::Bytes(8 * GI)));
        assert_eq!(s.for_ordinal(7), Some(Limit::Bytes(4 * GI)));
        let s = spec("0=8Gi,1=50%");
        assert_eq!(s.for_ordinal(1), Some(Limit::Fraction(0.5)));
        assert_eq!(s.for_ordinal(2), None);
    }

    #[test]
    fn uuid_keys() {
        const G2: &str = "GPU-face0000-0000-0000-0000-000000000002";
        let s = spec(&format!("1Gi,{G2}=2Gi,1=3Gi"));
        let DeviceKey::Uuid(u) = &s.devices[0].0 else {
            panic!("{s:?}")
        };
        assert!(!u.mig);
        assert_eq!(
            u.bytes,
            [0xfa, 0xce, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]
        );
        assert_eq!(u.to_string(), G2);
        assert_eq!(s.devices[0].0.to_string(), G2);
        // Upper case and a MIG spelling parse to the same bytes; display is canonical.
        let m = spec("mig-FACE0000-0000-0000-0000-000000000002=4Gi");
        let DeviceKey::Uuid(mu) = &m.devices[0].0 else {
            panic!()
        };
        assert!(mu.mig);
        assert_eq!(mu.bytes, u.bytes);
        assert_eq!(mu.to_string(), "MIG-face0000-0000-0000-0000-000000000002");
        // By UUID first, then by ordinal, then the default.
        let u2 = u.bytes;
        let mut u0 = u2;
        u0[15] = 0;
        assert_eq!(s.for_device(0, Some(&u2)), Some(Limit::Bytes(2 * GI)));
        assert_eq!(s.for_device(1, Some(&u0)), Some(Limit::Bytes(3 * GI)));
        assert_eq!(s.for_device(0, Some(&u0)), Some(Limit::Bytes(GI)));
        assert_eq!(s.for_device(0, None), Some(Limit::Bytes(GI)));
        assert_eq!(
            s.for_ordinal(0),
            Some(Limit::Bytes(GI)),
            "for_ordinal ignores UUID keys"
        );
        assert_eq!(s.uuid_keys().count(), 1);
        // Checking against the visible devices.
        let check = |s: &LimitSpec, v: &[[u8; 16]]| {
            check_var_keys("GPUCAP_LIMIT", s, Some(v.len()), || Some(v))
        };
        assert!(check(&s, &[u0, [9; 16], u2]).is_ok());
        let e = check(&s, &[u0, [9; 16]]).unwrap_err();
        assert!(
            e.contains(G2) && e.contains("matches none of the 2 GPU(s)"),
            "{e}"
        );
        let e = check(&s, &[u0, u2]).unwrap_err();
        assert!(e.contains("names GPU 1 twice") && e.contains(G2), "{e}");
        assert!(check(&spec("4Gi"), &[]).is_ok());
    }

    #[test]
    fn resolve_and_display() {
        assert_eq!(Limit::Bytes(8 * GI).resolve(80 * GI), 8 * GI);
        assert_eq!(Limit::Bytes(100 * GI).resolve(80 * GI), 100 * GI);
        assert_eq!(Limit::Fraction(0.5).resolve(80 * GI), 40 * GI);
        assert_eq!(Limit::Fraction(1.0).resolve(85_899_345_920), 85_899_345_920);
        assert_eq!(Limit::Fraction(1.0 / 3.0).resolve(10), 3);
        assert_eq!(Limit::Bytes(8 * GI).to_string(), "8 GiB");
        assert_eq!(Limit::Bytes(GI + GI / 2).to_string(), "1.5 GiB");
        assert_eq!(Limit::Fraction(0.5).to_string(), "50%");
        assert_eq!(Limit::Fraction(0.125).to_string(), "12.5%");
        // Below 1 %: two significant digits, never 0% (0.0000001 was shown as "0%").
        assert_eq!(Limit::Fraction(0.0000001).to_string(), "0.00001%");
        assert_eq!(Limit::Fraction(0.005).to_string(), "0.5%");
        assert_eq!(Limit::Fraction(0.000025).to_string(), "0.0025%");
        assert_eq!(Limit::Fraction(0.00001234).to_string(), "0.0012%");
        assert_eq!(Limit::Fraction(1.0).to_string(), "100%");
        assert_eq!(Limit::Fraction(1.0 / 3.0).to_string(), "33.33%");
    }

    #[test]
    fn a_bare_number_under_a_mebibyte_is_refused_with_the_unit_it_lacks() {
        for (input, suggestion) in [
            ("8", "did you mean 8Gi?"),
            ("1", "did you mean 1Gi?"),
            ("80", "did you mean 80Gi?"),
            ("1023", "did you mean 1023Gi?"),
            ("1024", "did you mean 1024Mi?"),
            ("512000", "did you mean 512000Mi?"),
            ("524287", "did you mean 524287Mi?"),
            // As MiB, more than any GPU: the least a bare number may be.
            ("524288", "did you mean 1Mi?"),
            ("1048575", "did you mean 1Mi?"),
            (" 8 ", "did you mean 8Gi?"),
            ("0=8,1=4Gi", "did you mean 8Gi?"),
            ("4Gi,1=16", "did you mean 16Gi?"),
            (
                "GPU-face0000-0000-0000-0000-000000000002=8",
                "did you mean 8Gi?",
            ),
            ("007", "did you mean 7Gi?"),
        ] {
            let e = spec_err(input);
            assert!(
                e.contains(suggestion) && e.contains("bytes") && !e.contains('\n'),
                "{input:?}: {e:?} lacks {suggestion:?}"
            );
        }
        // The error of an item names it.
        assert!(spec_err("0=8,1=4Gi").starts_with("item 1 (\"0=8\"): 8 has no unit"));
        // From 1 MiB a bare number is bytes; fractions and units are unchanged.
        assert_eq!(single("1048576"), Limit::Bytes(1 << 20));
        assert_eq!(single("0.5"), Limit::Fraction(0.5));
        assert_eq!(single("1.0"), Limit::Fraction(1.0));
        assert_eq!(single("50%"), Limit::Fraction(0.5));
        assert_eq!(single("8Ki"), Limit::Bytes(8 << 10));
        // Zero keeps its own error.
        assert!(spec_err("0").contains("cap of 0 bytes"));
        // Through the variable: the ConfigError names it.
        let e = from_vars([("GPUCAP_LIMIT", "8")]).unwrap_err();
        assert_eq!(e.var, "GPUCAP_LIMIT");
        assert!(e.to_string().contains("did you mean 8Gi?"), "{e}");
    }

    #[test]
    fn small_byte_caps_are_written_with_their_unit() {
        // to_gpucap_limit (gpucap.env) writes what parse_limit_spec reads back.
        let s = hami_spec(Some(512 << 10), &[(1, 2 << 30)]);
        let text = s.to_gpucap_limit().unwrap();
        assert_eq!(text, "524288B,1=2147483648");
        assert_eq!(spec(&text).default, s.default);
    }

    #[test]
    fn bad_limits() {
        for (input, needle) in [
            ("", "empty value"),
            ("   ", "empty value"),
            ("abc", "does not start with a number"),
            ("150%", "(0%, 100%]"),
            ("0%", "(0%, 100%]"),
            ("-5%", "negative"),
            ("abc%", "not a percentage"),
            ("%", "not a percentage"),
            ("-1Gi", "negative"),
            ("8m", "m is milli in Kubernetes"),
            ("8XiB", "unknown unit"),
            ("8 Gi", "whitespace"),
            ("0", "cap of 0 bytes"),
            ("0Gi", "cap of 0 bytes"),
            ("0.0", "cap of 0 bytes"),
            ("0.0%", "(0%, 100%]"),
            ("2.5", "a fraction must be in (0, 1]"),
            ("1.01", "a fraction must be in (0, 1]"),
            ("1.", "not a number"),
            ("18446744073709551616", "too large"),
            ("4Gi,,1=2Gi", "item 2 is empty"),
            ("4Gi,", "item 2 is empty"),
            (",4Gi", "item 1 is empty"),
            ("4Gi,8Gi", "more than one default"),
            ("0:8Gi", "a GPU's own figure is written with '=': 0=8Gi"),
            (
                "4Gi, 1 : 50%",
                "a GPU's own figure is written with '=': 1=50%",
            ),
            (
                "GPU-face0000-0000-0000-0000-000000000001:1Gi",
                "written with '=': GPU-face0000-0000-0000-0000-000000000001=1Gi",
            ),
            ("8:", "unknown unit \":\""),
            ("x:8Gi", "does not start with a number"),
            ("0=1Gi,0=2Gi", "GPU 0 is listed twice"),
            ("0=1Gi, 00=2Gi", "GPU 0 is listed twice"),
            ("0=", "no limit after '0='"),
            ("0=  ,1=1Gi", "no limit after '0='"),
            ("=8Gi", "missing device"),
            ("64=1Gi", "out of range"),
            ("99999999999=1Gi", "out of range"),
            ("-1=1Gi", "not a CUDA ordinal"),
            ("GPU-0=1Gi", "is not a UUID"),
            ("GPU=1Gi", "not a CUDA ordinal"),
            (
                "MIG-GPU-face0000-0000-0000-0000-000000000001/1/0=1Gi",
                "old MIG-GPU-",
            ),
            (
                "GPU-face0000-0000-0000-0000-00000000000g=1Gi",
                "is not a UUID",
            ),
            (
                "GPU-face0000-0000-0000-00000000000000001=1Gi",
                "is not a UUID",
            ),
            (
                "GPU-face0000-0000-0000-0000-000000000001=1Gi,gpu-FACE0000-0000-0000-0000-000000000001=2Gi",
                "is listed twice",
            ),
            ("a=1Gi", "not a CUDA ordinal"),
            ("0=abc", "does not start with a number"),
            ("0=8Gi=9Gi", "unknown unit"),
            ("1=150%,2Gi", "(0%, 100%]"),
        ] {
            let e = spec_err(input);
            assert!(e.contains(needle), "{input:?}: {e:?} lacks {needle:?}");
        }
        // In a list the error names the item.
        assert!(spec_err("4Gi,1=abc").starts_with("item 2 (\"1=abc\"): "));
    }

    #[test]
    fn log_levels() {
        assert_eq!(parse_log_level("off"), Ok(LogLevel::Off));
        assert_eq!(parse_log_level("error"), Ok(LogLevel::Error));
        assert_eq!(parse_log_level("warn"), Ok(LogLevel::Warn));
        assert_eq!(parse_log_level("info"), Ok(LogLevel::Info));
        assert_eq!(parse_log_level("debug"), Ok(LogLevel::Debug));
        assert_eq!(parse_log_level("DEBUG"), Ok(LogLevel::Debug));
        assert_eq!(parse_log_level(" Warn "), Ok(LogLevel::Warn));
        assert!(parse_log_level("").is_err());
        assert!(parse_log_level("verbose").is_err());
        assert!(parse_log_level("warning").is_err());
        assert!(LogLevel::Off < LogLevel::Error && LogLevel::Info < LogLevel::Debug);
        assert_eq!(LogLevel::Info.to_string(), "info");
    }

    fn vars(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        from_vars(pairs.iter().copied())
    }

    #[test]
    fn ordinal_keys_move_from_the_frame_they_were_written_under() {
        // Each of gpucap's per-GPU variables' keys move, the origin shown with them.
        let c = vars(&[
            ("GPUCAP_LIMIT", "0=256Mi,1=1Gi"),
            ("GPUCAP_POOL", "p"),
            ("GPUCAP_GUARANTEE", "1=512Mi"),
            ("GPUCAP_ORDINALS", "all"),
            ("CUDA_VISIBLE_DEVICES", "1"),
        ])
        .unwrap();
        let limit = c.limit.as_ref().unwrap();
        assert_eq!(limit.for_ordinal(0), Some(Limit::Bytes(GI)));
        assert_eq!(
            limit.for_ordinal(1),
            None,
            "the parent's GPU 0 is not this one's"
        );
        let g = c.guarantee.as_ref().unwrap();
        assert_eq!(g.for_ordinal(0), Some(Limit::Bytes(512 << 20)));
        assert_eq!(c.ordinals.as_ref().map(|o| &o.frame), Some(&Frame::All));
        assert_eq!(c.cap_sources[0].spec.for_ordinal(0), Some(Limit::Bytes(GI)));
        assert!(
            c.origins
                .iter()
                .all(|o| o.key.is_none() || o.key == Some(DeviceKey::Ordinal(0))),
            "{:?}",
            c.origins
        );
        assert!(
            c.info
                .iter()
                .any(|l| l.contains("written under GPUCAP_ORDINALS=all")
                    && l.contains("CUDA_VISIBLE_DEVICES=1")),
            "{:?}",
            c.info
        );
        // A driver's grant is never moved: where the frame would move or drop one of its
        // keys, the configuration fails closed; where it moves none, it stands.
        for grant in [
            vec![("CUDA_DEVICE_MEMORY_LIMIT_0", "256m")],
            vec![
                ("GPUCAP_LIMIT", "0=256Mi"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "256m"),
            ],
        ] {
            for (frame, visible, moves) in
                [("1", "0", true), ("1,0", "0,1", true), ("all", "0", false)]
            {
                let mut v = grant.clone();
                v.extend([
                    ("GPUCAP_ORDINALS", frame),
                    ("CUDA_VISIBLE_DEVICES", visible),
                ]);
                match vars(&v) {
                    Err(e) if moves => {
                        assert_eq!(e.var, "GPUCAP_ORDINALS");
                        assert!(e.reason.contains("a cap handed down"), "{e}");
                    }
                    Ok(c) if !moves => {
                        assert_eq!(
                            c.limit.unwrap().for_ordinal(0),
                            Some(Limit::Bytes(256 << 20))
                        )
                    }
                    other => panic!("{v:?}: {other:?}"),
                }
            }
        }
        // Bound to the keys it came with: moved where they are those, not where they
        // were set since (or by a launcher).
        let handed = |limit: &str| {
            let d = keys_digest([format!("GPUCAP_LIMIT={limit}").as_bytes()].into_iter());
            format!("all@{}", String::from_utf8(digest_hex(d).to_vec()).unwrap())
        };
        let frame = handed("0=256Mi,1=1Gi");
        let c = vars(&[
            ("GPUCAP_LIMIT", "0=256Mi,1=1Gi"),
            ("GPUCAP_ORDINALS", &frame),
            ("CUDA_VISIBLE_DEVICES", "1"),
        ])
        .unwrap();
        assert_eq!(c.limit.unwrap().for_ordinal(0), Some(Limit::Bytes(GI)));
        let c = vars(&[
            ("GPUCAP_LIMIT", "0=256Mi"),
            ("GPUCAP_ORDINALS", &frame),
            ("CUDA_VISIBLE_DEVICES", "1"),
        ])
        .unwrap();
        assert_eq!(
            c.limit.unwrap().for_ordinal(0),
            Some(Limit::Bytes(256 << 20))
        );
        assert!(
            c.info
                .iter()
                .any(|l| l.contains("came with other ordinal keys")),
            "{:?}",
            c.info
        );
        // A grant whose keys the frame only reorders, each GPU keeping its figure, stands.
        let v = [
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "1024m"),
            ("GPUCAP_ORDINALS", "1,0"),
            ("CUDA_VISIBLE_DEVICES", "0,1"),
        ];
        assert!(vars(&v).is_ok(), "{:?}", vars(&v));
        let mut v = v.to_vec();
        v[1] = ("CUDA_DEVICE_MEMORY_LIMIT_1", "2048m");
        assert_eq!(vars(&v).unwrap_err().var, "GPUCAP_ORDINALS");
        // Where every key names a GPU this process does not see, a warning says so.
        let c = vars(&[
            ("GPUCAP_LIMIT", "0=4Gi"),
            ("GPUCAP_ORDINALS", "all"),
            ("CUDA_VISIBLE_DEVICES", "1"),
        ])
        .unwrap();
        assert!(
            c.notes
                .iter()
                .any(|l| l
                    .contains("GPUCAP_LIMIT names by ordinal only GPUs this process does not see")),
            "{:?}",
            c.notes
        );
        // Without the variable, the keys are the process's own ordinals.
        let c = vars(&[("GPUCAP_LIMIT", "0=256Mi"), ("CUDA_VISIBLE_DEVICES", "1")]).unwrap();
        assert_eq!(
            c.limit.unwrap().for_ordinal(0),
            Some(Limit::Bytes(256 << 20))
        );
        // What cannot be told fails closed, naming the variable.
        let e = vars(&[
            ("GPUCAP_LIMIT", "0=256Mi"),
            ("GPUCAP_ORDINALS", "all"),
            ("CUDA_VISIBLE_DEVICES", "GPU-aaaa"),
        ])
        .unwrap_err();
        assert_eq!(e.var, "GPUCAP_ORDINALS");
        assert!(e.reason.contains("indices against UUIDs"), "{e}");
        let e = vars(&[("GPUCAP_ORDINALS", "first")]).unwrap_err();
        assert!(
            e.to_string()
                .contains("accepted: all, or a CUDA_VISIBLE_DEVICES list"),
            "{e}"
        );
    }

    #[test]
    fn a_file_holds_no_frame_and_none_is_written_to_one() {
        let e = parse_env_file("GPUCAP_LIMIT=0=1Gi\nGPUCAP_ORDINALS=1\n").unwrap_err();
        assert!(
            e.contains("line 2: GPUCAP_ORDINALS belongs to a process's environment"),
            "{e}"
        );
        let e =
            format_env_file([("GPUCAP_LIMIT", "0=1Gi"), ("GPUCAP_ORDINALS", "0,1")]).unwrap_err();
        assert!(
            e.contains("GPUCAP_ORDINALS=\"0,1\" moves the ordinal keys"),
            "{e}"
        );
    }

    #[test]
    fn defaults_when_unset() {
        let c = vars(&[("PATH", "/usr/bin"), ("HOME", "/root")]).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.limit, None);
        assert_eq!(c.log, LogLevel::Warn);
        assert!(!c.growth);
        assert_eq!(c.report, None);
    }

    #[test]
    fn all_vars() {
        let c = vars(&[
            ("GPUCAP_LIMIT", "4Gi,1=50%"),
            ("GPUCAP_LOG", "Debug"),
            ("GPUCAP_LIB", "/opt/gpucap/libgpucap.so"),
            ("GPUCAP_GROWTH", "yes"),
            ("GPUCAP_REPORT", "/tmp/r.json"),
            ("OTHER", ""),
        ])
        .unwrap();
        assert_eq!(c.limit, Some(spec("4Gi,1=50%")));
        assert_eq!(c.log, LogLevel::Debug);
        assert!(c.growth);
        assert_eq!(c.report, Some(PathBuf::from("/tmp/r.json")));
    }

    #[test]
    fn growth_values() {
        for (v, b) in [
            ("0", false),
            ("1", true),
            ("true", true),
            ("FALSE", false),
            ("yes", true),
            ("no", false),
            ("on", true),
            ("off", false),
        ] {
            assert_eq!(vars(&[("GPUCAP_GROWTH", v)]).unwrap().growth, b, "{v}");
        }
        let e = vars(&[("GPUCAP_GROWTH", "maybe")]).unwrap_err();
        assert_eq!(e.var, "GPUCAP_GROWTH");
        assert_eq!(e.accepted, GROWTH_ACCEPTED);
    }

    #[test]
    fn error_line_format() {
        let e = vars(&[("GPUCAP_LIMIT", "150%")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "gpucap: invalid GPUCAP_LIMIT=\"150%\": a percentage must be in \
             (0%, 100%]; accepted: 8Gi, 512MiB, 1073741824, 50%, 0.5, 0=8Gi,1=50%, 4Gi,1=8Gi, \
             GPU-<uuid>=8Gi, MIG-<uuid>=4Gi, none (no cap, on purpose)"
        );
        assert!(!e.to_string().contains('\n'));
        let e = vars(&[("GPUCAP_LOG", "loud")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "gpucap: invalid GPUCAP_LOG=\"loud\": unknown log level; \
             accepted: off, error, warn, info, debug"
        );
    }

    #[test]
    fn unknown_gpucap_variable() {
        let e = vars(&[("GPUCAP_LIMIT", "8Gi"), ("GPUCAP_LIMT", "8Gi")]).unwrap_err();
        assert_eq!(e.var, "GPUCAP_LIMT");
        assert!(e.to_string().contains("unknown gpucap variable"));
        for known in KNOWN_VARS {
            assert!(e.to_string().contains(known));
        }
        // Case matters: GPUCAP_limit is not GPUCAP_LIMIT.
        assert_eq!(
            vars(&[("GPUCAP_limit", "8Gi")]).unwrap_err().var,
            "GPUCAP_limit"
        );
        assert_eq!(vars(&[("GPUCAP_", "x")]).unwrap_err().var, "GPUCAP_");
        // Only the GPUCAP_ prefix is ours...
        assert!(vars(&[("GPUCAPLIMIT", "x"), ("XGPUCAP_LIMIT", "x")]).is_ok());
        // ...in any case: one of ours in another case would be ignored, so it is an
        // error that names the variable meant.
        for (name, meant) in [
            ("gpucap_limit", "GPUCAP_LIMIT"),
            ("Gpucap_Pool", "GPUCAP_POOL"),
            ("GPUCAP_limit", "GPUCAP_LIMIT"),
        ] {
            let e = vars(&[(name, "1Gi")]).unwrap_err();
            assert_eq!(e.var, name);
            assert!(e.reason.ends_with(&format!("did you mean {meant}?")), "{e}");
            assert!(looked_at(name.as_bytes()), "the shim copies {name}");
        }
        let e = vars(&[("gpucap_limt", "1Gi")]).unwrap_err();
        assert!(e.reason.contains("unknown gpucap variable"), "{e}");
    }

    #[test]
    fn hamis_unit_spellings_in_gpucap_limit() {
        let c = vars(&[("GPUCAP_LIMIT", "8g")]).unwrap();
        assert_eq!(c.limit, Some(spec("8Gi")));
        let c = vars(&[("GPUCAP_LIMIT", "1t")]).unwrap();
        assert_eq!(c.limit, Some(spec("1Ti")));
        // Kubernetes' G stays decimal.
        let c = vars(&[("GPUCAP_LIMIT", "8G")]).unwrap();
        assert_eq!(c.limit, Some(spec("8000000000")));
        let e = vars(&[("GPUCAP_LIMIT", "8m")]).unwrap_err();
        assert_eq!(e.var, "GPUCAP_LIMIT");
        assert!(e.reason.contains("m is milli in Kubernetes"), "{e}");
        assert!(e.reason.contains("write 8Mi"), "{e}");
        assert_eq!(e.to_string().lines().count(), 1, "{e}");
    }

    #[test]
    fn a_misspelt_variable_names_the_nearest() {
        for (typed, meant) in [
            ("GPUCAP_LIMT", "GPUCAP_LIMIT"),
            ("GPUCAP_LIMITT", "GPUCAP_LIMIT"),
            ("GPUCAP_POL", "GPUCAP_POOL"),
            ("gpucap_limt", "GPUCAP_LIMIT"),
        ] {
            let e = vars(&[(typed, "8Gi")]).unwrap_err();
            assert_eq!(e.var, typed);
            assert!(
                e.reason
                    .starts_with(&format!("unknown gpucap variable: did you mean {meant}?")),
                "{e}"
            );
            assert_eq!(e.to_string().lines().count(), 1, "{e}");
        }
        // Nothing within 2 edits: no guess.
        let e = vars(&[("GPUCAP_FROBNICATE", "1")]).unwrap_err();
        assert!(!e.reason.contains("did you mean"), "{e}");
        assert_eq!(
            nearest_name("--limt", &["--limit", "--pool"]),
            Some("--limit")
        );
        assert_eq!(nearest_name("--xyzzy", &["--limit", "--pool"]), None);
    }

    #[test]
    fn limit_none_is_no_cap_on_purpose() {
        for v in ["none", "None", " NONE "] {
            let c = vars(&[("GPUCAP_LIMIT", v)]).unwrap();
            assert_eq!(c.limit, None, "{v}");
            assert!(limit_is_none(v));
        }
        assert!(!limit_is_none("8Gi"));
        // A cap from HAMi-core's variable beside it contradicts it.
        let e = vars(&[("GPUCAP_LIMIT", "none"), ("CUDA_DEVICE_MEMORY_LIMIT", "1g")]).unwrap_err();
        assert!(e.reason.contains("CUDA_DEVICE_MEMORY_LIMIT=1g"), "{e}");
        // Not a share: a guarantee of none is an error.
        assert!(vars(&[("GPUCAP_POOL", "p"), ("GPUCAP_GUARANTEE", "none")]).is_err());
    }

    #[test]
    fn decimal_units_and_tiny_shares_get_notes() {
        let c = vars(&[("GPUCAP_LIMIT", "8GB,1=0.5%,2=8Gi")]).unwrap();
        assert_eq!(
            c.notes,
            [
                "note: GPUCAP_LIMIT's 8GB is in decimal units: 8000000000 bytes, 7.45 GiB (for \
                 binary units write 8Gi)",
                "note: GPUCAP_LIMIT's 0.5% is 0.5% of the GPU's memory, below 1 %",
            ]
        );
        assert_eq!(vars(&[("GPUCAP_LIMIT", "1.5tb")]).unwrap().notes.len(), 1);
        assert!(
            vars(&[("GPUCAP_LIMIT", "8Gi,1=1%")])
                .unwrap()
                .notes
                .is_empty()
        );
    }

    #[test]
    fn a_share_of_no_cap_is_refused_where_the_configuration_is_read() {
        for (var, v) in [
            ("GPUCAP_GUARANTEE", "50%"),
            ("GPUCAP_CEILING", "0.5"),
            ("GPUCAP_GUARANTEE", "1Gi,1=25%"),
        ] {
            let e = vars(&[("GPUCAP_POOL", "x"), (var, v)]).unwrap_err();
            assert_eq!(e.var, var);
            assert!(e.reason.contains("the pool has no cap"), "{e}");
        }
        // Bytes need no cap; with a cap a share is fine.
        assert!(vars(&[("GPUCAP_POOL", "x"), ("GPUCAP_GUARANTEE", "1Gi")]).is_ok());
        let ok = [
            ("GPUCAP_POOL", "x"),
            ("GPUCAP_LIMIT", "4Gi"),
            ("GPUCAP_GUARANTEE", "50%"),
        ];
        assert!(vars(&ok).is_ok());
    }

    #[test]
    fn empty_values_are_errors() {
        for var in KNOWN_VARS {
            let e = vars(&[(var, "")]).unwrap_err();
            assert_eq!(e.var, *var);
            assert!(e.reason.contains("empty"), "{e}");
            let e = vars(&[(var, "  ")]).unwrap_err();
            assert_eq!(e.var, *var);
        }
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (var, value) in [
            ("GPUCAP_LIMIT", "abc"),
            ("GPUCAP_LIMIT", "-1Gi"),
            ("GPUCAP_LIMIT", "4Gi,,1=2Gi"),
            ("GPUCAP_LOG", "trace"),
            ("GPUCAP_GROWTH", "2"),
        ] {
            let e = vars(&[(var, value)]).unwrap_err();
            assert_eq!((e.var.as_str(), e.value.as_str()), (var, value));
            assert!(
                e.to_string()
                    .starts_with(&format!("gpucap: invalid {var}="))
            );
        }
    }

    #[test]
    fn first_occurrence_wins() {
        let c = vars(&[("GPUCAP_LOG", "info"), ("GPUCAP_LOG", "debug")]).unwrap();
        assert_eq!(c.log, LogLevel::Info);
    }

    #[test]
    fn non_utf8_variables() {
        let bad = OsStr::from_bytes(b"caf\xe9");
        // Ignored outside our prefix, as a name or as a value.
        let c = from_vars([
            (OsStr::new("GPUCAP_LIMIT"), OsStr::new("8Gi")),
            (OsStr::new("OTHER"), bad),
            (bad, OsStr::new("x")),
        ])
        .unwrap();
        assert_eq!(c.limit, Some(spec("8Gi")));
        // A GPUCAP_ value that is not UTF-8 is an error naming the variable.
        let e = from_vars([(OsStr::new("GPUCAP_LIMIT"), bad)]).unwrap_err();
        assert_eq!(e.var, "GPUCAP_LIMIT");
        assert_eq!(e.value, "caf\u{fffd}");
        assert!(e.reason.contains("UTF-8"));
        // So is a non-UTF-8 name with our prefix (it cannot be a known one).
        let name = OsStr::from_bytes(b"GPUCAP_\xff");
        let e = from_vars([(name, OsStr::new("1"))]).unwrap_err();
        assert_eq!(e.var, "GPUCAP_\u{fffd}");
        // OsString pairs work too.
        let owned: Vec<(OsString, OsString)> =
            vec![(OsString::from("GPUCAP_LOG"), OsString::from("off"))];
        assert_eq!(from_vars(owned).unwrap().log, LogLevel::Off);
    }

    #[test]
    fn ld_so_preload_and_home() {
        let c = vars(&[
            ("GPUCAP_LD_SO_PRELOAD", "1"),
            ("GPUCAP_HOME", "/opt/gpucap"),
        ])
        .unwrap();
        assert!(c.ld_so_preload);
        assert!(!Config::default().ld_so_preload);
        let e = vars(&[("GPUCAP_LD_SO_PRELOAD", "sometimes")]).unwrap_err();
        assert_eq!(e.var, "GPUCAP_LD_SO_PRELOAD");
        assert_eq!(e.accepted, LD_SO_PRELOAD_ACCEPTED);
        assert_eq!(
            vars(&[("GPUCAP_HOME", " ")]).unwrap_err().var,
            "GPUCAP_HOME"
        );
    }

    #[test]
    fn env_file_round_trip() {
        let env = [
            ("PATH", "/bin"),
            ("GPUCAP_LIMIT", "4Gi,1=50%"),
            ("GPUCAP_REPORT", "/tmp/r %p.json"),
            ("GPUCAP_LIMIT", "ignored: getenv finds the first"),
        ];
        let text = format_env_file(env).unwrap();
        assert!(text.starts_with('#'));
        assert!(
            text.ends_with("GPUCAP_LIMIT=4Gi,1=50%\nGPUCAP_REPORT=/tmp/r %p.json\n"),
            "{text}"
        );
        let pairs = parse_env_file(&text).unwrap();
        assert_eq!(
            pairs,
            [
                ("GPUCAP_LIMIT".to_string(), "4Gi,1=50%".to_string()),
                ("GPUCAP_REPORT".to_string(), "/tmp/r %p.json".to_string()),
            ]
        );
        let c = from_vars(pairs).unwrap();
        assert_eq!(c.limit, Some(spec("4Gi,1=50%")));
        // The flags of the command that wrote it are not the reader's: never written.
        let typed =
            format_env_file([("GPUCAP_LIMIT", "8GB"), ("GPUCAP_TYPED", "--limit")]).unwrap();
        assert!(
            typed.contains("GPUCAP_LIMIT=8GB\n") && !typed.contains("GPUCAP_TYPED"),
            "{typed}"
        );
        // Nothing to write: only the comment, which reads back as the default configuration.
        let empty = format_env_file([("HOME", "/root")]).unwrap();
        assert_eq!(
            from_vars(parse_env_file(&empty).unwrap()).unwrap(),
            Config::default()
        );
        assert!(
            format_env_file([("GPUCAP_REPORT", "a\nb")])
                .unwrap_err()
                .contains("line break")
        );
    }

    #[test]
    fn env_file_syntax() {
        let pairs =
            parse_env_file("\n  # comment\r\nGPUCAP_LOG=info\r\n\nGPUCAP_LIMIT=1=8Gi\n").unwrap();
        assert_eq!(
            pairs,
            [
                ("GPUCAP_LOG".to_string(), "info".to_string()),
                ("GPUCAP_LIMIT".to_string(), "1=8Gi".to_string()),
            ]
        );
        assert!(
            parse_env_file("GPUCAP_LOG info")
                .unwrap_err()
                .starts_with("line 1:")
        );
        assert!(
            parse_env_file("# x\nPATH=/bin")
                .unwrap_err()
                .starts_with("line 2:")
        );
        assert!(parse_env_file("export GPUCAP_LOG=info").is_err());
        // A name set twice is refused, naming both lines (an appended lower cap would
        // otherwise lose to the first).
        assert_eq!(
            parse_env_file("GPUCAP_LIMIT=2Gi\n# lower\nGPUCAP_LIMIT=1Gi\n").unwrap_err(),
            "line 3: GPUCAP_LIMIT is set again (first on line 1): keep one line for it"
        );
        // Names are validated by from_vars like the environment's.
        assert_eq!(
            from_vars(parse_env_file("GPUCAP_LIMT=1Gi").unwrap())
                .unwrap_err()
                .var,
            "GPUCAP_LIMT"
        );
        assert!(has_gpucap_vars([("GPUCAP_X", "")]));
        assert!(!has_gpucap_vars([("PATH", "/bin"), ("GPUCAPLIMIT", "1")]));
        // One of ours in another case is there (and an error): the file is not read
        // in its place.
        assert!(has_gpucap_vars([("PATH", "/bin"), ("gpucap_limit", "1")]));
    }
}

/// HAMi-core's variables (`CUDA_DEVICE_MEMORY_LIMIT*`) as strict aliases of GPUCAP_LIMIT.
mod hami {
    use super::super::*;
    use crate::config::file::parse_env_file;
    use crate::config::hami::{HAMI_ACCEPTED, HamiName, hami_name, parse_hami_value};

    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;

    fn vars(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        from_vars(pairs.iter().map(|&(k, v)| (k, v)))
    }

    #[test]
    fn values_hami_core_reads_the_same_way() {
        assert_eq!(parse_hami_value("8192m"), Ok(8192 * MI));
        assert_eq!(parse_hami_value("8192M"), Ok(8192 * MI));
        assert_eq!(parse_hami_value("8g"), Ok(8 * GI));
        assert_eq!(parse_hami_value("8G"), Ok(8 * GI));
        assert_eq!(parse_hami_value("1048576k"), Ok(GI));
        assert_eq!(parse_hami_value("1048576K"), Ok(GI));
        assert_eq!(parse_hami_value("1073741824"), Ok(GI));
        assert_eq!(parse_hami_value("1048576"), Ok(MI));
        assert_eq!(parse_hami_value("1k"), Ok(1024));
    }

    #[test]
    fn a_bare_hami_number_under_a_mebibyte_is_refused_with_the_unit_it_lacks() {
        // Bytes in HAMi-core as here: 8 would refuse everything in both.
        for (v, suggestion) in [
            ("1", "did you mean 1g?"),
            ("8", "did you mean 8g?"),
            ("4096", "did you mean 4096m?"),
            ("1048575", "did you mean 1m?"),
        ] {
            let e = parse_hami_value(v).expect_err(v);
            assert!(e.contains(suggestion), "{v:?}: {e}");
        }
        let e = vars(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "8")]).unwrap_err();
        assert_eq!(e.var, "CUDA_DEVICE_MEMORY_LIMIT_0");
        assert!(e.to_string().contains("did you mean 8g?"), "{e}");
    }

    #[test]
    fn values_hami_core_reads_otherwise_are_refused_with_why() {
        for (v, why) in [
            ("1Gi", "1 byte there"),
            ("8GiB", "8 bytes there"),
            ("512MiB", "512 bytes there"),
            ("8GB", "8 bytes there"),
            ("1.5g", "whole numbers only"),
            ("010m", "octal"),
            ("0x10m", "hexadecimal"),
            ("abc", "no limit"),
            ("", "empty"),
            ("0", "0 means no limit"),
            ("0g", "0 means no limit"),
            ("-1g", "negative"),
            ("+1g", "sign"),
            (" 8g", "spaces"),
            ("8g ", "spaces"),
            ("8 g", "spaces"),
            ("1t", "no T unit"),
            ("1T", "no T unit"),
            ("1Ti", "no T unit"),
            ("g", "not a number"),
            ("18446744073709551616", "too large"),
            ("17179869184g", "too large"),
            ("8é", "last character"),
        ] {
            let e = parse_hami_value(v).expect_err(v);
            assert!(e.contains(why), "{v:?}: {e}");
        }
    }

    #[test]
    fn names() {
        assert_eq!(hami_name("CUDA_DEVICE_MEMORY_LIMIT"), Ok(HamiName::All));
        assert_eq!(
            hami_name("CUDA_DEVICE_MEMORY_LIMIT_0"),
            Ok(HamiName::Gpu(0))
        );
        assert_eq!(
            hami_name("CUDA_DEVICE_MEMORY_LIMIT_15"),
            Ok(HamiName::Gpu(15))
        );
        assert_eq!(
            hami_name("CUDA_DEVICE_MEMORY_SHARED_CACHE"),
            Ok(HamiName::SharedCache)
        );
        for (n, why) in [
            ("CUDA_DEVICE_MEMORY_LIMT", "a typo?"),
            ("CUDA_DEVICE_MEMORY_LIMIT_", "a typo?"),
            ("CUDA_DEVICE_MEMORY_LIMIT_A", "a typo?"),
            (
                "CUDA_DEVICE_MEMORY_LIMIT_01",
                "CUDA_DEVICE_MEMORY_LIMIT_1, without",
            ),
            ("CUDA_DEVICE_MEMORY_LIMIT_16", "_15 only"),
            ("CUDA_DEVICE_MEMORY_LIMIT_99999999999", "_15 only"),
        ] {
            let e = hami_name(n).expect_err(n);
            assert!(e.contains(why), "{n}: {e}");
        }
    }

    #[test]
    fn all_gpus_and_per_gpu_combine_like_a_gpucap_limit_list() {
        let c = vars(&[
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "4096m"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "8g"),
        ])
        .unwrap();
        let spec = c.limit.unwrap();
        assert_eq!(spec.from, LimitFrom::Hami);
        assert_eq!(spec.for_ordinal(0), Some(Limit::Bytes(8 * GI)));
        assert_eq!(spec.for_ordinal(1), Some(Limit::Bytes(4 * GI)));
        assert_eq!(spec.for_ordinal(9), Some(Limit::Bytes(8 * GI)));
        let same = parse_limit_spec("8Gi,1=4Gi").unwrap();
        assert_eq!((spec.default, &spec.devices), (same.default, &same.devices));
        assert_eq!(
            spec.source(),
            "CUDA_DEVICE_MEMORY_LIMIT, CUDA_DEVICE_MEMORY_LIMIT_1"
        );
        assert_eq!(spec.var_for_ordinal(1), "CUDA_DEVICE_MEMORY_LIMIT_1");
        assert_eq!(spec.var_for_ordinal(0), "CUDA_DEVICE_MEMORY_LIMIT");

        // The device plugin's form: one GPU, in MiB; the others are not capped.
        let spec = vars(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "8192m")])
            .unwrap()
            .limit
            .unwrap();
        assert_eq!(spec.for_ordinal(0), Some(Limit::Bytes(8 * GI)));
        assert_eq!(spec.for_ordinal(1), None);
    }

    #[test]
    fn a_bad_value_or_name_is_an_error_naming_it() {
        let e = vars(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "1Gi")]).unwrap_err();
        assert_eq!(e.var, "CUDA_DEVICE_MEMORY_LIMIT_0");
        assert_eq!(e.value, "1Gi");
        assert_eq!(e.accepted, HAMI_ACCEPTED);
        let line = e.to_string();
        assert!(
            line.starts_with("gpucap: invalid CUDA_DEVICE_MEMORY_LIMIT_0=\"1Gi\": "),
            "{line}"
        );
        let e = vars(&[("CUDA_DEVICE_MEMORY_LIMT", "8g")]).unwrap_err();
        assert_eq!(e.var, "CUDA_DEVICE_MEMORY_LIMT");
        assert!(e.reason.contains("CUDA_DEVICE_MEMORY_LIMIT_<n>"), "{e}");
        let e = vars(&[("CUDA_DEVICE_MEMORY_LIMIT", "")]).unwrap_err();
        assert!(e.reason.contains("empty"), "{e}");
    }

    #[test]
    fn gpucap_limit_and_hami_must_agree_on_every_gpu() {
        // Agree: the same bytes for every ordinal.
        for (ours, theirs) in [
            ("8Gi", vec![("CUDA_DEVICE_MEMORY_LIMIT", "8g")]),
            ("0=8Gi", vec![("CUDA_DEVICE_MEMORY_LIMIT_0", "8192m")]),
            (
                "4Gi,1=8Gi",
                vec![
                    ("CUDA_DEVICE_MEMORY_LIMIT", "4096m"),
                    ("CUDA_DEVICE_MEMORY_LIMIT_1", "8g"),
                ],
            ),
            ("8Gi,0=8Gi", vec![("CUDA_DEVICE_MEMORY_LIMIT", "8g")]),
        ] {
            let mut pairs = vec![("GPUCAP_LIMIT", ours)];
            pairs.extend(theirs.iter().copied());
            let c = vars(&pairs).unwrap_or_else(|e| panic!("{ours} {theirs:?}: {e}"));
            let spec = c.limit.unwrap();
            assert_eq!(spec.from, LimitFrom::Both);
            assert_eq!(spec.devices, parse_limit_spec(ours).unwrap().devices);
        }
        // Disagree: some GPU gets another cap, or a cap from only one of them.
        for (ours, theirs, why) in [
            (
                "8Gi",
                vec![("CUDA_DEVICE_MEMORY_LIMIT", "4g")],
                "GPU 0 gets 8 GiB",
            ),
            (
                "8Gi",
                vec![("CUDA_DEVICE_MEMORY_LIMIT_0", "8g")],
                "GPU 1 gets 8 GiB",
            ),
            (
                "0=8Gi",
                vec![("CUDA_DEVICE_MEMORY_LIMIT", "8g")],
                "GPU 1 gets no cap",
            ),
            ("8G", vec![("CUDA_DEVICE_MEMORY_LIMIT", "8g")], "GPU 0 gets"),
            (
                "50%",
                vec![("CUDA_DEVICE_MEMORY_LIMIT", "8g")],
                "share of its memory",
            ),
            (
                "GPU-face0000-0000-0000-0000-000000000001=8Gi",
                vec![("CUDA_DEVICE_MEMORY_LIMIT", "8g")],
                "UUID",
            ),
        ] {
            let mut pairs = vec![("GPUCAP_LIMIT", ours)];
            pairs.extend(theirs.iter().copied());
            let e = vars(&pairs).expect_err(ours);
            assert_eq!(e.var, "GPUCAP_LIMIT");
            assert!(e.reason.contains(why), "{ours} {theirs:?}: {e}");
            assert!(e.reason.contains(theirs[0].0), "{e}");
        }
    }

    #[test]
    fn a_gpu_hami_does_not_cap_is_named_with_the_variables_that_were_set() {
        // CUDA_DEVICE_MEMORY_LIMIT_0=8g caps GPU 0 only; GPUCAP_LIMIT=8Gi caps every GPU.
        let e = vars(&[
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "8g"),
            ("GPUCAP_LIMIT", "8Gi"),
        ])
        .unwrap_err();
        let line = e.to_string();
        assert!(!line.contains("no variable"), "{line}");
        assert!(
            line.contains(
                "GPU 1 gets 8 GiB from GPUCAP_LIMIT but no cap from HAMi-core's variables \
                 (CUDA_DEVICE_MEMORY_LIMIT_0 set, which names no cap for GPU 1)"
            ),
            "{line}"
        );
        // The GPUCAP_LIMIT that says the same as HAMi-core's, exactly.
        assert!(line.contains("GPUCAP_LIMIT=0=8Gi alone"), "{line}");
        let e = vars(&[
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "1536m"),
            ("CUDA_DEVICE_MEMORY_LIMIT_2", "1000k"),
            ("GPUCAP_LIMIT", "0=1536Mi"),
        ])
        .unwrap_err();
        let line = e.to_string();
        assert!(
            line.contains(
                "GPU 2 gets no cap from GPUCAP_LIMIT but 1000 KiB from CUDA_DEVICE_MEMORY_LIMIT_2"
            ),
            "{line}"
        );
        assert!(
            line.contains("GPUCAP_LIMIT=0=1536Mi,2=1000Ki alone"),
            "{line}"
        );
    }

    #[test]
    fn hami_keys_are_checked_against_the_visible_gpus_by_their_name() {
        let spec = vars(&[("CUDA_DEVICE_MEMORY_LIMIT_1", "8g")])
            .unwrap()
            .limit
            .unwrap();
        let e = check_var_keys("GPUCAP_LIMIT", &spec, Some(1), || None).unwrap_err();
        assert!(
            e.starts_with("gpucap: CUDA_DEVICE_MEMORY_LIMIT_1 names GPU 1, but only 1 GPU"),
            "{e}"
        );
        assert_eq!(
            check_var_keys("GPUCAP_LIMIT", &spec, Some(2), || None),
            Ok(())
        );
    }

    #[test]
    fn other_hami_variables_are_noted_not_silently_ignored() {
        let c = vars(&[
            ("CUDA_DEVICE_SM_LIMIT", "50"),
            ("CUDA_DEVICE_SM_LIMIT_1", "30"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/vgpu/x.cache"),
            ("CUDA_TASK_PRIORITY", "1"),
        ])
        .unwrap();
        assert_eq!(c.limit, None);
        assert_eq!(c.notes.len(), 3, "{:?}", c.notes);
        assert!(c.notes[0].contains("CUDA_DEVICE_SM_LIMIT") && c.notes[0].contains("memory only"));
        assert!(c.notes[1].contains("CUDA_DEVICE_SM_LIMIT_1"));
        assert_eq!(
            c.pool,
            Some(PoolSpec::Path("/tmp/vgpu/x.cache".into())),
            "the pool's file"
        );
        assert!(vars(&[("PATH", "/bin")]).unwrap().notes.is_empty());
    }

    #[test]
    fn the_env_file_gets_the_resolved_gpucap_limit() {
        let pairs = [
            ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "8192m"),
            ("GPUCAP_LOG", "info"),
        ];
        assert!(has_gpucap_vars(pairs[..1].iter().copied()));
        let text = format_env_file(pairs.iter().copied()).unwrap();
        assert!(
            text.contains("GPUCAP_LIMIT=4294967296,1=8589934592\n"),
            "{text}"
        );
        let from_file = from_vars(parse_env_file(&text).unwrap()).unwrap();
        let direct = vars(&pairs).unwrap();
        let (a, b) = (from_file.limit.unwrap(), direct.limit.unwrap());
        assert_eq!((a.default, a.devices), (b.default, b.devices));
        assert_eq!(from_file.log, LogLevel::Info);
        // With GPUCAP_LIMIT set (and agreeing), it is written as it is, once.
        let text =
            format_env_file([("GPUCAP_LIMIT", "8Gi"), ("CUDA_DEVICE_MEMORY_LIMIT", "8g")]).unwrap();
        assert_eq!(text.matches("GPUCAP_LIMIT=").count(), 1, "{text}");
        assert!(text.contains("GPUCAP_LIMIT=8Gi\n"), "{text}");
    }
}

/// Property tests: no input, of any characters or bytes, makes a parser panic (the shim
/// would turn a panic into CUDA_ERROR_UNKNOWN on every call, the CLI into exit 101), and
/// what is accepted is well formed. Case counts are bounded so these run in seconds.
mod properties {
    use super::super::*;
    use crate::config::file::parse_env_file;
    use crate::config::hami::parse_hami_value;
    use crate::config::pool_vars::parse_wait;
    use crate::size::{format_bytes, parse_size};
    use proptest::prelude::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    fn config(cases: u32) -> ProptestConfig {
        ProptestConfig {
            cases,
            // Found inputs are printed; nothing is written into the source tree.
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// Strings made of the pieces the parsers look at (prefixes, separators, units,
    /// digits) and of multi-byte characters, so that a prefix is often followed by a
    /// character that a byte offset would cut in two (`GPUé`, `MIG-abc€`).
    fn hostile() -> impl Strategy<Value = String> {
        const PIECES: &[&str] = &[
            "GPU-",
            "MIG-",
            "GPU",
            "gpu-",
            "MIG-GPU-",
            "face0000",
            "-0000",
            "000000000001",
            "é",
            "€",
            "𝄞",
            "\u{fffd}",
            "\u{a0}",
            "ab",
            "0",
            "1",
            "63",
            "64",
            ".",
            "%",
            "=",
            ",",
            " ",
            "-",
            "Gi",
            "MiB",
            "k",
            "B",
        ];
        let piece = prop_oneof![
            prop::sample::select(PIECES).prop_map(String::from),
            "\\PC{0,3}",
        ];
        prop::collection::vec(piece, 0..10).prop_map(|v| v.concat())
    }

    /// Checks what `parse_limit_spec` accepted: keys once each, in range; caps non-zero;
    /// fractions in (0, 1].
    fn well_formed(spec: &LimitSpec) -> Result<(), TestCaseError> {
        let limits = spec
            .devices
            .iter()
            .map(|(_, l)| l)
            .chain(spec.default.as_ref());
        for limit in limits {
            match *limit {
                Limit::Bytes(b) => prop_assert!(b > 0),
                Limit::Fraction(f) => prop_assert!(f > 0.0 && f <= 1.0, "{f}"),
            }
        }
        for (i, (key, _)) in spec.devices.iter().enumerate() {
            if let DeviceKey::Ordinal(n) = key {
                prop_assert!((*n as usize) < MAX_DEVICES);
            }
            prop_assert!(!spec.devices[..i].iter().any(|(k, _)| k == key));
        }
        Ok(())
    }

    /// An environment's variable: a name made of the names and prefixes the
    /// configuration reads, cut short or run on, and a value that is often valid.
    fn env_var() -> impl Strategy<Value = (String, String)> {
        let stems = prop::sample::select(vec![
            "GPUCAP_LIMIT",
            "GPUCAP_POOL",
            "GPUCAP_LOG",
            "GPUCAP_WAIT",
            "GPUCAP_GROWTH",
            "GPUCAP_",
            "GPUCAP",
            "GPUCA",
            "CUDA_DEVICE_MEMORY_LIMIT",
            "CUDA_DEVICE_MEMORY_LIMIT_0",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            "CUDA_DEVICE_MEMORY_",
            "CUDA_DEVICE_SM_LIMIT",
            "CUDA_DEVICE_SM_LIMIT_1",
            "CUDA_TASK_PRIORITY",
            "GPU_CORE_UTILIZATION_POLICY",
            "ACTIVE_OOM_KILLER",
            "CUDA_VISIBLE_DEVICES",
            "PATH",
            "HOME",
            "gpucap_limit",
        ]);
        let tails = prop::sample::select(vec!["", "", "_", "0", "X", "_1", "S"]);
        let values = prop::sample::select(vec![
            "1Gi", "50%", "512m", "0", "", "yes", "p", "2s", "abc", "1,0=2Gi", "error",
        ]);
        (stems, tails, values).prop_map(|(s, t, v)| (format!("{s}{t}"), v.to_string()))
    }

    proptest! {
        #![proptest_config(config(2000))]

        /// The shim copies only the variables `looked_at` names: the configuration of
        /// any environment must come out the same (errors and notes included).
        #[test]
        fn only_the_variables_looked_at_matter(env in prop::collection::vec(env_var(), 0..6)) {
            let kept: Vec<_> = env.iter().filter(|(k, _)| looked_at(k.as_bytes())).cloned().collect();
            prop_assert_eq!(from_vars(env.clone()), from_vars(kept));
        }

        #[test]
        fn limit_spec_of_any_string(s in "\\PC*") {
            if let Ok(spec) = parse_limit_spec(&s) {
                well_formed(&spec)?;
            }
        }

        #[test]
        fn limit_spec_of_hostile_strings(key in hostile(), value in hostile()) {
            for s in [format!("{key}={value}"), format!("1Gi,{key}=1Gi"), key.clone()] {
                match parse_limit_spec(&s) {
                    Ok(spec) => well_formed(&spec)?,
                    Err(e) => prop_assert!(!e.is_empty() && !e.contains('\n'), "{e:?}"),
                }
            }
        }

        #[test]
        fn uuid_of_any_string(s in prop_oneof!["\\PC*", hostile()]) {
            if let Ok(u) = DeviceUuid::parse(&s) {
                // What is accepted prints in the canonical form, which reads back the same.
                prop_assert_eq!(DeviceUuid::parse(&u.to_string()), Ok(u));
            }
        }

        #[test]
        fn size_of_any_string(s in prop_oneof!["\\PC*", hostile()]) {
            if let Err(e) = parse_size(&s) {
                prop_assert!(e.contains("accepted:"), "{e:?}");
            }
        }

        #[test]
        fn a_bare_number_is_a_cap_only_from_a_mebibyte(n in 0u64..(4 << 20), hami in any::<bool>()) {
            let text = n.to_string();
            let got = if hami {
                parse_hami_value(&text).map(Limit::Bytes)
            } else {
                parse_limit_spec(&text).map(|s| s.default.unwrap())
            };
            match got {
                Ok(l) => {
                    prop_assert!(n >= 1 << 20);
                    prop_assert_eq!(l, Limit::Bytes(n));
                }
                Err(e) => {
                    prop_assert!(n < 1 << 20);
                    let meant = if n >= 512 * 1024 { "1".to_string() } else { n.to_string() };
                    prop_assert!(n == 0 || e.contains(&format!("did you mean {meant}")), "{e}");
                }
            }
        }

        #[test]
        fn sizes_round_trip(b in any::<u64>()) {
            prop_assert_eq!(parse_size(&b.to_string()), Ok(b));
            prop_assert!(!format_bytes(b).is_empty());
        }

        #[test]
        fn any_bytes_in_any_variable(
            name in prop_oneof![
                Just(b"GPUCAP_LIMIT".to_vec()),
                Just(b"GPUCAP_LOG".to_vec()),
                Just(b"GPUCAP_GROWTH".to_vec()),
                Just(b"GPUCAP_LD_SO_PRELOAD".to_vec()),
                Just(b"GPUCAP_REPORT".to_vec()),
                prop::collection::vec(any::<u8>().prop_filter("no NUL or =", |b| *b != 0 && *b != b'='), 0..16)
                    .prop_map(|tail| [b"GPUCAP_".as_slice(), &tail].concat()),
            ],
            value in prop_oneof![
                prop::collection::vec(any::<u8>(), 0..40),
                hostile().prop_map(String::into_bytes),
            ],
        ) {
            let pair = (OsStr::from_bytes(&name), OsStr::from_bytes(&value));
            if let Err(e) = from_vars([pair]) {
                // The error names the variable and is one line, whatever the bytes.
                if let Ok(n) = std::str::from_utf8(&name) {
                    prop_assert_eq!(e.var.as_str(), n);
                }
                prop_assert!(!e.to_string().contains(['\n', '\r']), "{e}");
            }
        }

        #[test]
        fn hami_value_of_any_string(s in prop_oneof!["\\PC*", hostile()]) {
            match parse_hami_value(&s) {
                Ok(b) => {
                    prop_assert!(b > 0);
                    // Only digits and one last unit letter are accepted.
                    let digits = s.trim_end_matches(['k', 'K', 'm', 'M', 'g', 'G']);
                    prop_assert!(digits.len() + 1 >= s.len());
                    prop_assert!(digits.bytes().all(|c| c.is_ascii_digit()) && !digits.starts_with('0'));
                }
                Err(e) => prop_assert!(!e.is_empty() && !e.contains('\n'), "{e:?}"),
            }
        }

        #[test]
        fn any_bytes_in_any_hami_variable(
            name in prop_oneof![
                Just(b"CUDA_DEVICE_MEMORY_LIMIT".to_vec()),
                (0u32..20).prop_map(|n| format!("CUDA_DEVICE_MEMORY_LIMIT_{n}").into_bytes()),
                Just(b"CUDA_DEVICE_MEMORY_SHARED_CACHE".to_vec()),
                Just(b"CUDA_DEVICE_SM_LIMIT".to_vec()),
                prop::collection::vec(any::<u8>().prop_filter("no NUL or =", |b| *b != 0 && *b != b'='), 0..16)
                    .prop_map(|tail| [b"CUDA_DEVICE_MEMORY_".as_slice(), &tail].concat()),
            ],
            value in prop_oneof![
                prop::collection::vec(any::<u8>(), 0..40),
                hostile().prop_map(String::into_bytes),
            ],
            ours in prop_oneof![Just(None), hostile().prop_map(Some)],
        ) {
            let mut pairs = vec![(OsStr::from_bytes(&name), OsStr::from_bytes(&value))];
            if let Some(o) = &ours {
                pairs.push((OsStr::new("GPUCAP_LIMIT"), OsStr::new(o.as_str())));
            }
            match from_vars(pairs) {
                Ok(c) => {
                    if let Some(spec) = &c.limit {
                        well_formed(spec)?;
                    }
                }
                Err(e) => prop_assert!(!e.to_string().contains(['\n', '\r']), "{e}"),
            }
        }

        #[test]
        fn env_file_of_any_text(text in "(\\PC|\n|\r){0,120}", tail in hostile()) {
            let text = format!("{text}\nGPUCAP_LIMIT={tail}\n");
            if let Ok(pairs) = parse_env_file(&text) {
                let _ = from_vars(pairs);
            }
        }
    }

    fn vars(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        from_vars(pairs.iter().copied())
    }

    #[test]
    fn pools_are_named_or_given_as_absolute_paths() {
        let c = vars(&[("GPUCAP_POOL", "train-1.a_b")]).unwrap();
        assert_eq!(c.pool, Some(PoolSpec::Name("train-1.a_b".into())));
        let c = vars(&[
            ("GPUCAP_POOL", "/run/gpucap/x.pool"),
            ("GPUCAP_POOL_DIR", "/dev/shm/p"),
        ])
        .unwrap();
        assert_eq!(c.pool, Some(PoolSpec::Path("/run/gpucap/x.pool".into())));
        assert_eq!(c.pool_dir, Some("/dev/shm/p".into()));
        for bad in [
            "a/b",
            "../x",
            ".hidden",
            "sp ace",
            "x/",
            "/x/",
            "é",
            &"n".repeat(65),
        ] {
            let e = vars(&[("GPUCAP_POOL", bad)]).unwrap_err();
            assert_eq!(e.var, "GPUCAP_POOL", "{bad}");
            assert!(e.to_string().contains("accepted: a pool name"), "{e}");
        }
        assert_eq!(
            vars(&[("GPUCAP_POOL", "off")]).unwrap().pool,
            None,
            "off: no pool"
        );
        let e = vars(&[("GPUCAP_POOL_DIR", "rel/dir")]).unwrap_err();
        assert!(e.to_string().contains("absolute"), "{e}");
        // A missing directory is an error (tests/cli.rs): the message must not promise
        // to make it.
        assert!(
            e.to_string().contains("an existing directory") && !e.to_string().contains("created"),
            "{e}"
        );
    }

    #[test]
    fn hamis_shared_cache_is_the_pool_file_and_must_agree_with_gpucap_pool() {
        let c = vars(&[("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/cudevshr.cache")]).unwrap();
        assert_eq!(c.pool, Some(PoolSpec::Path("/tmp/cudevshr.cache".into())));
        assert!(c.notes.is_empty(), "{:?}", c.notes);
        let same = vars(&[
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/c"),
            ("GPUCAP_POOL", "/tmp/c"),
        ])
        .unwrap();
        assert_eq!(same.pool, Some(PoolSpec::Path("/tmp/c".into())));
        let e = vars(&[
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/c"),
            ("GPUCAP_POOL", "train"),
        ])
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("another pool than CUDA_DEVICE_MEMORY_SHARED_CACHE"),
            "{e}"
        );
        let e = vars(&[("CUDA_DEVICE_MEMORY_SHARED_CACHE", "cache")]).unwrap_err();
        assert!(e.to_string().contains("must be absolute"), "{e}");
    }

    #[test]
    fn wait_durations() {
        use std::time::Duration;
        for (v, ms) in [
            ("0", 0),
            ("500ms", 500),
            ("30s", 30_000),
            ("5m", 300_000),
            ("1h", 3_600_000),
            ("24h", 86_400_000),
        ] {
            assert_eq!(parse_wait(v), Ok(Duration::from_millis(ms)), "{v}");
        }
        for v in [
            "",
            "s",
            "30",
            "1.5s",
            "-1s",
            "30 s",
            "030s",
            "25h",
            "1d",
            "99999999999999999999s",
            "0s0",
        ] {
            assert!(parse_wait(v).is_err(), "{v:?}");
        }
        let c = vars(&[("GPUCAP_WAIT", "30s"), ("GPUCAP_POOL", "p")]).unwrap();
        assert_eq!(c.wait, Duration::from_secs(30));
        let e = vars(&[("GPUCAP_WAIT", "30s")]).unwrap_err();
        assert!(e.to_string().contains("waiting needs a pool"), "{e}");
        assert_eq!(vars(&[("GPUCAP_WAIT", "0")]).unwrap().wait, Duration::ZERO);
        let e = vars(&[("GPUCAP_WAIT", "soon"), ("GPUCAP_POOL", "p")]).unwrap_err();
        assert!(e.to_string().contains("accepted: a duration"), "{e}");
    }

    #[test]
    fn a_pool_size_is_read_as_gpucap_limit_reads_one() {
        assert_eq!(parse_cap_size("8Gi"), Ok(8 << 30));
        assert_eq!(parse_cap_size("1073741824"), Ok(1 << 30));
        assert_eq!(parse_cap_size("8B"), Ok(8));
        assert_eq!(parse_cap_size("0"), Ok(0));
        let e = parse_cap_size("8").unwrap_err();
        assert!(e.contains("did you mean 8Gi?") && !e.contains('%'), "{e}");
        // The largest value a pool's cap word can hold as a cap (bytes + 1, and
        // u64::MAX there is "no cap"): …614 was taken and became no cap.
        assert_eq!(parse_cap_size("18446744073709551613B"), Ok(u64::MAX - 2));
        let e = parse_cap_size("18446744073709551614").unwrap_err();
        assert!(e.contains("the most is 18446744073709551613 bytes"), "{e}");
        let e = parse_cap_size("18446744073709551615").unwrap_err();
        assert!(e.contains("past any GPU"), "{e}");
        let e = parse_cap_size("1.5B").unwrap_err();
        assert!(e.contains("a fraction of a byte"), "{e}");
        assert!(parse_cap_size("50%").is_err());
    }

    #[test]
    fn off_in_other_letters_is_no_pool_name() {
        assert_eq!(parse_pool("off"), Ok(None));
        for v in ["OFF", "Off", "oFf"] {
            let e = parse_pool(v).unwrap_err();
            assert!(e.contains("off (lower case) is no pool"), "{v}: {e}");
        }
        assert!(parse_pool("offline").unwrap().is_some());
    }
}

mod hami_claim {
    use super::super::*;

    /// HAMi's shared cache names the container's one pool: GPUCAP_CLAIM_DIR naming another
    /// is an error naming both, as GPUCAP_POOL naming another is (before: an info line, and
    /// the container's processes no longer shared HAMi's budget).
    #[test]
    fn a_claim_dir_other_than_hamis_shared_cache_is_an_error() {
        let e = from_vars([
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/vgpu/x.cache"),
            ("GPUCAP_CLAIM_DIR", "/tmp/mine"),
        ])
        .unwrap_err();
        assert_eq!(e.var, "GPUCAP_CLAIM_DIR");
        assert!(
            e.reason
                .contains("another pool than CUDA_DEVICE_MEMORY_SHARED_CACHE"),
            "{e}"
        );
        // Without HAMi's cache, the claim is the pool.
        let c = from_vars([("GPUCAP_LIMIT", "1Gi"), ("GPUCAP_CLAIM_DIR", "/tmp/mine")]).unwrap();
        assert!(matches!(c.pool, Some(PoolSpec::Claim(_))));
    }
}
