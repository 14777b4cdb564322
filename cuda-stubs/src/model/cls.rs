//! Context-local storage: the values NVIDIA's cudart keeps per context through the private
//! table `c693336e-…` (api/export_tables/context.rs): `(context, key) -> value`, each with an
//! optional destructor the driver calls when the context ends (cudart frees its per-context
//! state there, e.g. at `cudaDeviceReset`).

use super::HashMap;
use std::sync::{LazyLock, Mutex};

use super::ctx::Ctx;

/// `void dtor(CUcontext, void *key, void *value)`.
pub type Dtor = Option<unsafe extern "C" fn(Ctx, usize, usize)>;

#[derive(Clone, Copy)]
struct Entry {
    value: usize,
    dtor: Dtor,
}

static STORE: LazyLock<Mutex<HashMap<(Ctx, usize), Entry>>> = LazyLock::new(Default::default);

fn store() -> std::sync::MutexGuard<'static, HashMap<(Ctx, usize), Entry>> {
    STORE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Stores `value` under `key` for `ctx` (replacing what was there).
pub fn put(ctx: Ctx, key: usize, value: usize, dtor: Dtor) {
    store().insert((ctx, key), Entry { value, dtor });
}

/// Forgets `key` of `ctx` (without calling its destructor); false if it was not there.
pub fn delete(ctx: Ctx, key: usize) -> bool {
    store().remove(&(ctx, key)).is_some()
}

/// The value under `key` for `ctx`.
pub fn get(ctx: Ctx, key: usize) -> Option<usize> {
    store().get(&(ctx, key)).map(|e| e.value)
}

/// The context ended: its values are dropped and their destructors called (outside the
/// lock: a destructor may call the driver).
pub fn end_context(ctx: Ctx) {
    let ended: Vec<(usize, Entry)> = {
        let mut s = store();
        let keys: Vec<(Ctx, usize)> = s.keys().filter(|k| k.0 == ctx).copied().collect();
        keys.into_iter()
            .filter_map(|k| s.remove(&k).map(|e| (k.1, e)))
            .collect()
    };
    for (key, e) in ended {
        if let Some(dtor) = e.dtor {
            // SAFETY: the destructor cudart registered for this value, called once with the
            // arguments it expects (context, key, value).
            unsafe { dtor(ctx, key, e.value) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static SEEN: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn record(_ctx: Ctx, key: usize, value: usize) {
        SEEN.fetch_add(key * 1000 + value, Ordering::SeqCst);
    }

    #[test]
    fn values_per_context_and_destructors_at_the_end() {
        let (a, b) = (0xa000_0001, 0xb000_0001);
        put(a, 1, 11, Some(record));
        put(a, 2, 22, None);
        put(b, 1, 33, Some(record));
        assert_eq!(get(a, 1), Some(11));
        assert_eq!(get(b, 1), Some(33));
        put(a, 1, 12, Some(record));
        assert_eq!(get(a, 1), Some(12));
        assert!(delete(a, 2));
        assert!(!delete(a, 2));
        assert_eq!(get(a, 2), None);
        end_context(a);
        assert_eq!(
            SEEN.load(Ordering::SeqCst),
            1012,
            "one destructor, with its value"
        );
        assert_eq!(get(a, 1), None);
        assert_eq!(get(b, 1), Some(33), "another context keeps its values");
        end_context(b);
    }
}
