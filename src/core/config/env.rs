//! Reading the environment into a [`Config`]: which variables are looked at, a `GPUCAP_*`
//! name that is not gpucap's, and [`from_vars`], which sorts the variables (gpucap's own,
//! HAMi-core's, the drivers' hand-overs) and resolves them with the parsers of the files
//! beside it (no envy: it would only copy the same strings into a struct).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use super::hami::{
    HAMI_IGNORED, HAMI_PREFIX, HAMI_SHARED_CACHE, Hami, check_agree, hami_ignored_note,
};
use super::limit::{
    DeviceKey, LimitFrom, LimitSpec, MAX_DEVICES, limit_is_none, limit_notes, parse_limit_spec,
};
use super::model::{Config, ConfigError, Origin};
use super::ordinals::{ORDINALS_VAR, Ordinals, own_frame, pairs_digest, reframe, reframe_key};
use super::pool_vars::{PoolSpec, parse_pool_dir};
use super::shares::check_shares;
use super::sources::{
    HAMI_CLASSIC, HAMI_DRA, HandoverVars, NVIDIA_VISIBLE_DEVICES, apply, claim_pool_note,
    hami_claim_dir, hami_classic_by_uuid, hami_dra_spec, is_handover_name, merge_hami_by_uuid,
};
use super::typed::{name_typed, name_typed_error, typed_flags};
use super::vars::{KNOWN_VARS, VARS, accepted_of, known_vars_list};

pub(crate) const PREFIX: &str = "GPUCAP_";

/// Whether `name` starts with `GPUCAP_` in any case (`gpucap_limit`, `Gpucap_Pool`):
/// such a name is read, and one not spelled exactly as gpucap's is an error like a
/// typo, never silently ignored (a cap set that way would not bind).
pub(crate) fn gpucap_like(name: &[u8]) -> bool {
    name.get(..PREFIX.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(PREFIX.as_bytes()))
}

/// The error for a `GPUCAP_*`-like name that is not one of `KNOWN_VARS`: in another
/// case, the variable it means (`did you mean GPUCAP_LIMIT?`), else a typo.
fn unknown_var(name: &str, value: &str) -> ConfigError {
    let upper = name.to_ascii_uppercase();
    let reason = match KNOWN_VARS.iter().find(|&&n| n == upper) {
        Some(known) => format!(
            "gpucap's variables are upper case, so this one would be ignored: did you mean \
             {known}?"
        ),
        None => match nearest_name(name, KNOWN_VARS) {
            Some(near) => format!(
                "unknown gpucap variable: did you mean {near}? (the known variables are \
                 {})",
                known_vars_list()
            ),
            None => format!(
                "unknown gpucap variable (a typo?); the known variables are {}",
                known_vars_list()
            ),
        },
    };
    ConfigError {
        var: name.to_string(),
        value: value.to_string(),
        reason,
        accepted: "",
    }
}

/// The one of `names` nearest to `typed` by edit distance (insertions, deletions,
/// substitutions; ASCII case ignored), if at most 2 edits away: a typo's "did you mean".
/// On a tie, the first of `names`.
pub fn nearest_name<'a>(typed: &str, names: &[&'a str]) -> Option<&'a str> {
    let typed: Vec<u8> = typed.bytes().map(|b| b.to_ascii_uppercase()).collect();
    let mut best: Option<(usize, &'a str)> = None;
    for &name in names {
        let mut row: Vec<usize> = (0..=typed.len()).collect();
        for (i, c) in name.bytes().map(|b| b.to_ascii_uppercase()).enumerate() {
            let mut diagonal = row[0];
            row[0] = i + 1;
            for (j, &t) in typed.iter().enumerate() {
                let above = row[j + 1];
                row[j + 1] = (diagonal + usize::from(c != t))
                    .min(row[j] + 1)
                    .min(above + 1);
                diagonal = above;
            }
        }
        let d = row[typed.len()];
        if d <= 2 && best.is_none_or(|(b, _)| d < b) {
            best = Some((d, name));
        }
    }
    best.map(|(_, name)| name)
}

/// The variable that picks and orders the GPUs CUDA shows (read only to know whether
/// the environment sets it: `Config::visible_chosen`).
const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

/// Whether [`from_vars`] looks at a variable of this name: a caller reading a whole
/// environment may pass only these (the shim copies just them, not every variable).
pub fn looked_at(name: &[u8]) -> bool {
    gpucap_like(name)
        || name.starts_with(HAMI_PREFIX.as_bytes())
        || is_handover_name(name)
        || name == NVIDIA_VISIBLE_DEVICES.as_bytes()
        || name == CUDA_VISIBLE_DEVICES.as_bytes()
        || HAMI_IGNORED
            .iter()
            .any(|(var, _)| name.starts_with(var.as_bytes()))
}

/// Whether a name that begins with the byte `first` may be one [`looked_at`] names
/// (`tests::every_name_looked_at_begins_with_a_byte_the_filter_lets_through`): a walk
/// of a whole environment reads no further into the other entries.
pub fn may_be_looked_at(first: u8) -> bool {
    matches!(first, b'A' | b'C' | b'G' | b'g' | b'M' | b'N')
}

/// Builds the configuration from `(name, value)` pairs, e.g. `std::env::vars_os()`.
///
/// Only variables whose name starts with `GPUCAP_`, HAMi-core's `CUDA_DEVICE_MEMORY_*`
/// and the other HAMi-core names of `HAMI_IGNORED` are looked at; other variables,
/// non-UTF-8 ones included, are ignored. A `GPUCAP_*` name not in `KNOWN_VARS`, a
/// `CUDA_DEVICE_MEMORY_*` name HAMi-core does not read (see `hami_name`), a non-UTF-8
/// value, an empty value or an invalid value is an error. `CUDA_DEVICE_MEMORY_LIMIT`
/// and `CUDA_DEVICE_MEMORY_LIMIT_<n>` give the limit when `GPUCAP_LIMIT` is unset
/// (`<all>,<n>=<v>`), and must agree with it when it is set (`check_agree`).
/// When a name occurs twice, the first occurrence wins (as with `getenv`).
pub fn from_vars<I, K, V>(vars: I) -> Result<Config, ConfigError>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let vars: Vec<(K, V)> = vars.into_iter().collect();
    // An error about a variable a typed flag set names the flag (`GPUCAP_TYPED`, first
    // occurrence; a bad value is an error of its own below).
    let value_of = |name: &str| {
        vars.iter()
            .find(|(k, _)| k.as_ref() == name)
            .and_then(|(_, v)| v.as_ref().to_str())
            .map(str::to_string)
    };
    let typed = value_of("GPUCAP_TYPED")
        .map(|v| typed_flags(&v, value_of))
        .unwrap_or_default();
    read_vars(vars).map_err(|e| name_typed_error(e, &typed))
}

/// [`from_vars`] but for naming the flags typed in its errors: the variables sorted
/// (gpucap's own, HAMi-core's, the drivers' hand-overs), checked and resolved.
fn read_vars<K, V>(vars: Vec<(K, V)>) -> Result<Config, ConfigError>
where
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let mut ours: Vec<(String, String)> = Vec::new();
    let mut hami = Hami::default();
    let mut handover = HandoverVars::default();
    let mut visible: Option<String> = None;
    let mut visible_chosen = false;
    let mut cuda_visible: Option<String> = None;
    // The digest of the ordinal keys there are (`GPUCAP_ORDINALS` is bound to some).
    let keys = pairs_digest(
        vars.iter()
            .map(|(k, v)| (k.as_ref().as_bytes(), v.as_ref().as_bytes())),
    );
    for (k, v) in vars {
        let (k, v) = (k.as_ref(), v.as_ref());
        if k.as_bytes() == CUDA_VISIBLE_DEVICES.as_bytes() {
            visible_chosen = true;
            cuda_visible.get_or_insert_with(|| v.to_string_lossy().into_owned());
            continue;
        }
        if k.as_bytes() == NVIDIA_VISIBLE_DEVICES.as_bytes() {
            // Read only to key HAMi's per-index caps (never an error: not a cap).
            visible.get_or_insert_with(|| v.to_string_lossy().into_owned());
            continue;
        }
        if k.as_bytes().starts_with(HAMI_PREFIX.as_bytes()) {
            hami.add(k, v)?;
            continue;
        }
        if is_handover_name(k.as_bytes()) {
            let name = k.to_string_lossy().into_owned();
            let Some(value) = v.to_str() else {
                return Err(ConfigError {
                    var: name,
                    value: v.to_string_lossy().into_owned(),
                    reason: "the value is not valid UTF-8".into(),
                    accepted: "",
                });
            };
            handover.push(name, value.to_string());
            continue;
        }
        if let Some(note) = hami_ignored_note(k) {
            if !hami.notes.contains(&note) {
                hami.notes.push(note);
            }
            continue;
        }
        if !gpucap_like(k.as_bytes()) {
            continue;
        }
        let name = k.to_string_lossy();
        let Some(&known) = KNOWN_VARS.iter().find(|&&n| n == name) else {
            return Err(unknown_var(&name, &v.to_string_lossy()));
        };
        let Some(value) = v.to_str() else {
            return Err(ConfigError {
                var: known.to_string(),
                value: v.to_string_lossy().into_owned(),
                reason: "the value is not valid UTF-8".into(),
                accepted: accepted_of(known),
            });
        };
        if ours.iter().any(|(n, _)| n == known) {
            continue; // first occurrence wins, like getenv
        }
        if value.trim().is_empty() {
            return Err(ConfigError {
                var: known.to_string(),
                value: value.to_string(),
                reason: format!("empty value (unset {known} instead of setting it empty)"),
                accepted: accepted_of(known),
            });
        }
        ours.push((known.to_string(), value.to_string()));
    }

    // The value of a known variable, as given (the first occurrence).
    let raw = |name: &str| {
        ours.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };

    let bad = |var: &str, value: &str, reason: String| ConfigError {
        var: var.to_string(),
        value: value.to_string(),
        reason,
        accepted: accepted_of(var),
    };
    let limit_none = raw("GPUCAP_LIMIT").is_some_and(limit_is_none);
    let mut config = Config {
        visible_chosen,
        limit_none,
        ..Config::default()
    };
    if let Some(v) = raw("GPUCAP_LIMIT").filter(|_| !limit_none) {
        config.limit = Some(parse_limit_spec(v).map_err(|r| bad("GPUCAP_LIMIT", v, r))?);
    }
    if limit_none && hami.spec().is_some() {
        return Err(ConfigError {
            var: "GPUCAP_LIMIT".into(),
            value: raw("GPUCAP_LIMIT").unwrap_or_default().to_string(),
            reason: format!(
                "none asks for no cap, and HAMi-core's variables set one ({}); unset one of them",
                hami.listing()
            ),
            accepted: "",
        });
    }
    let hami_claim = hami.shared_cache.as_deref().and_then(hami_claim_dir);
    let hami_driver = if hami_claim.is_some() {
        HAMI_DRA
    } else {
        HAMI_CLASSIC
    };
    let mut origins = hami.origins(hami_driver);
    if hami_claim.is_some() {
        // The DRA plugin's indices name no GPU: one cap for every GPU.
        for o in &mut origins {
            o.key = None;
        }
    }
    let hami_spec = hami.spec().map(|spec| match hami_claim {
        Some(_) => {
            let (mut spec, note) = hami_dra_spec(spec);
            spec.from = LimitFrom::Handover("HAMi DRA's CUDA_DEVICE_MEMORY_LIMIT_<i>");
            hami.notes.extend(note);
            spec
        }
        None => spec,
    });
    // The classic plugin's indices follow NVIDIA_VISIBLE_DEVICES: keyed by UUID where
    // it lists UUIDs, compared with GPUCAP_LIMIT on the visible GPUs (as vgpu-manager's).
    let by_uuid = match (&hami_spec, &visible) {
        (Some(spec), Some(v)) if hami_claim.is_none() => {
            hami_classic_by_uuid(spec, &mut origins, v)?
        }
        _ => None,
    };
    if let Some(keyed) = by_uuid {
        merge_hami_by_uuid(&mut config, keyed, &origins, raw("GPUCAP_LIMIT"));
    } else if let Some(from_hami) = hami_spec {
        config.limit = Some(match (config.limit.take(), raw("GPUCAP_LIMIT")) {
            (Some(mut ours), Some(v)) => {
                check_agree(&ours, &from_hami).map_err(|reason| ConfigError {
                    var: "GPUCAP_LIMIT".into(),
                    value: v.to_string(),
                    reason: format!("{reason} (HAMi-core's: {})", hami.listing()),
                    accepted: "",
                })?;
                ours.from = LimitFrom::Both;
                ours
            }
            _ => from_hami,
        });
    }
    config.notes = hami.notes;
    if let Some(spec) = &config.limit {
        if raw("GPUCAP_LIMIT").is_some() {
            config.origins.push(Origin {
                var: "GPUCAP_LIMIT".into(),
                value: raw("GPUCAP_LIMIT").unwrap_or_default().to_string(),
                driver: "gpucap",
                key: None,
            });
        }
        if spec.from != LimitFrom::Gpucap {
            config.origins.extend(origins);
        }
    }
    if let Some(v) = raw("GPUCAP_LIMIT").filter(|_| config.limit.is_some()) {
        config.notes.extend(limit_notes("GPUCAP_LIMIT", v));
    }
    for var in VARS {
        if let (Some(set), Some(v)) = (var.set, raw(var.name)) {
            set(&mut config, v).map_err(|r| bad(var.name, v, r))?;
        }
    }
    let hami_cache = hami.shared_cache.clone();
    if let Some(cache) = hami.shared_cache {
        let path = match hami_claim {
            Some(dir) => {
                let claim = PoolSpec::Claim(dir);
                let why = format!("the directory of {HAMI_SHARED_CACHE}, {HAMI_DRA}");
                config.info.push(claim_pool_note(&claim, &why));
                claim
            }
            None => PoolSpec::Path(PathBuf::from(&cache)),
        };
        match (&config.pool, raw("GPUCAP_POOL")) {
            (Some(ours), Some(v)) if *ours != path => {
                return Err(ConfigError {
                    var: "GPUCAP_POOL".into(),
                    value: v.to_string(),
                    reason: format!(
                        "it names another pool than {HAMI_SHARED_CACHE}={cache:?}; set one of \
                         them, or both to the same absolute path"
                    ),
                    accepted: "",
                });
            }
            _ => config.pool = Some(path),
        }
    }
    if let Some(v) = raw("GPUCAP_CLAIM_DIR") {
        let dir = parse_pool_dir(v).map_err(|r| bad("GPUCAP_CLAIM_DIR", v, r))?;
        match &config.pool {
            Some(p) if raw("GPUCAP_POOL").is_some() && *p != PoolSpec::Claim(dir.clone()) => {
                return Err(ConfigError {
                    var: "GPUCAP_POOL".into(),
                    value: raw("GPUCAP_POOL").unwrap_or_default().to_string(),
                    reason: format!(
                        "it names another pool than GPUCAP_CLAIM_DIR={v:?}; set one of them"
                    ),
                    accepted: "",
                });
            }
            // HAMi's shared cache names the container's one pool: a claim elsewhere would
            // leave it, each process still capped, the container's sum no longer.
            Some(p) if *p != PoolSpec::Claim(dir.clone()) && hami_cache.is_some() => {
                return Err(ConfigError {
                    var: "GPUCAP_CLAIM_DIR".into(),
                    value: v.to_string(),
                    reason: format!(
                        "it names another pool than {HAMI_SHARED_CACHE}={:?}; set one of them",
                        hami_cache.unwrap_or_default()
                    ),
                    accepted: "",
                });
            }
            _ => {
                let claim = PoolSpec::Claim(dir);
                config
                    .info
                    .push(claim_pool_note(&claim, "GPUCAP_CLAIM_DIR"));
                config.pool = Some(claim);
            }
        }
    }
    let raw_owned = |var: &str| raw(var).map(str::to_string);
    apply(
        &mut config,
        &handover,
        &raw_owned,
        raw("GPUCAP_CLAIM_DIR").is_some(),
    )?;
    apply_frame(&mut config, cuda_visible.as_deref(), keys).map_err(|reason| ConfigError {
        var: ORDINALS_VAR.into(),
        value: raw(ORDINALS_VAR).unwrap_or_default().to_string(),
        reason,
        accepted: "",
    })?;
    if !config.wait.is_zero() && config.pool.is_none() {
        let v = raw("GPUCAP_WAIT").unwrap_or_default();
        return Err(ConfigError {
            var: "GPUCAP_WAIT".into(),
            value: v.to_string(),
            reason: "waiting needs a pool (GPUCAP_POOL): only other members of a pool free \
                     memory an allocation could wait for"
                .into(),
            accepted: "",
        });
    }
    check_shares(&config, |var| raw(var).map(str::to_string))?;
    // GPUCAP_LIB is the CLI's business and GPUCAP_HOME the entrypoint's; only their
    // emptiness was checked above. The flags typed are those whose variable still holds
    // what the flag set (a child's own variable is named as the variable).
    if let Some(t) = raw("GPUCAP_TYPED") {
        config.typed = typed_flags(t, |var| raw(var).map(str::to_string));
    }
    name_typed(&mut config);
    Ok(config)
}

/// Moves every ordinal key of gpucap's own per-GPU variables (`GPUCAP_LIMIT`, its
/// source of caps and origin, `GPUCAP_GUARANTEE`, `GPUCAP_CEILING`) written under the
/// configuration's `GPUCAP_ORDINALS` onto its own ordinals under `visible` (its
/// `CUDA_VISIBLE_DEVICES`). A driver's grant (HAMi-core's variables, a hand-over) is a
/// ceiling the environment never moves: where the frame would move or drop one of its
/// keys, that is an error (fail closed). Nothing without the variable, nor where it is
/// bound to other keys than those there are (`keys`: their digest), which are then the
/// process's own: set since the frame was handed down, or by a launcher.
fn apply_frame(config: &mut Config, visible: Option<&str>, keys: u64) -> Result<(), String> {
    let Some(Ordinals { frame, keys: bound }) = config.ordinals.clone() else {
        return Ok(());
    };
    if bound.is_some_and(|d| d != keys) {
        config.info.push(format!(
            "{ORDINALS_VAR}={} came with other ordinal keys than this process's (set \
             since it was handed down): they count this process's own GPUs",
            frame.text()
        ));
        return Ok(());
    }
    let own = own_frame(visible);
    let ours = |spec: &LimitSpec| spec.from == LimitFrom::Gpucap;
    let grants = config
        .limit
        .iter()
        .chain(config.cap_sources.iter().map(|s| &s.spec))
        .filter(|s| !ours(s));
    for grant in grants {
        let mut moved = grant.clone();
        reframe(&mut moved, &frame, &own)?;
        let same = |n: u32| moved.for_ordinal(n) == grant.for_ordinal(n);
        if !(0..MAX_DEVICES as u32).all(same) {
            return Err(format!(
                "it would move the ordinal keys of {}, a cap handed down, which the \
                 environment never moves: unset {ORDINALS_VAR}, or leave the GPUs as the \
                 grant counts them (CUDA_VISIBLE_DEVICES)",
                grant.source()
            ));
        }
    }
    // Each of gpucap's own, named for the line below (the limit's source of caps moves
    // with it, unnamed).
    let named = [
        ("GPUCAP_LIMIT", config.limit.as_mut().filter(|s| ours(s))),
        ("GPUCAP_GUARANTEE", config.guarantee.as_mut()),
        ("GPUCAP_CEILING", config.ceiling.as_mut()),
    ];
    let mut emptied = Vec::new();
    for (name, spec) in named {
        let Some(spec) = spec else { continue };
        let keyed = spec
            .devices
            .iter()
            .any(|(k, _)| matches!(k, DeviceKey::Ordinal(_)));
        reframe(spec, &frame, &own)?;
        // Where every key named a GPU this process does not see, say so: its GPUs get
        // no figure from the variable, as they had none in the parent.
        if keyed && spec.devices.is_empty() && spec.default.is_none() {
            emptied.push(name);
        }
    }
    for spec in config
        .cap_sources
        .iter_mut()
        .map(|s| &mut s.spec)
        .filter(|s| ours(s))
    {
        reframe(spec, &frame, &own)?;
    }
    if !emptied.is_empty() {
        config.notes.push(format!(
            "{} names by ordinal only GPUs this process does not see (its keys count the GPUs \
             of {ORDINALS_VAR}={}, and CUDA_VISIBLE_DEVICES={} leaves none of them): no GPU \
             of this process gets a figure from it, as none did in its parent",
            emptied.join(" and "),
            frame.text(),
            visible.unwrap_or("unset"),
        ));
    }
    let mut origins = Vec::with_capacity(config.origins.len());
    for mut o in config.origins.drain(..) {
        match &o.key {
            Some(k) if o.driver == "gpucap" => {
                if let Some(k) = reframe_key(k, &frame, &own)? {
                    o.key = Some(k);
                    origins.push(o);
                }
            }
            _ => origins.push(o),
        }
    }
    config.origins = origins;
    if frame != own {
        config.info.push(format!(
            "the ordinal keys were written under {ORDINALS_VAR}={}: each is moved onto this \
             process's ordinal of the same GPU (CUDA_VISIBLE_DEVICES={}), and dropped where \
             it does not see that GPU",
            frame.text(),
            visible.unwrap_or("unset")
        ));
    }
    Ok(())
}
