//! [`Real`]: a driver function of a known C signature, callable from safe code. The
//! hook table hands one to each hook (the driver's function of the hooked name), so a
//! hook forwards a call as `real.call(..)`; the one `unsafe` of forwarding is here.

use std::ffi::c_void;
use std::marker::PhantomData;

use super::types::CuResult;

/// The driver's function taking the arguments `A`, a tuple: `(A, B)` for
/// `unsafe extern "C" fn(A, B) -> CUresult`. Covariant in `A`, so that a hook's typed
/// pointer arguments (each `Out<'_, T>` of its own lifetime) fit the function's.
pub struct Real<A>(*mut c_void, PhantomData<fn() -> A>);

impl<A> Clone for Real<A> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<A> Copy for Real<A> {}

impl<A> Real<A> {
    /// The function at `p`.
    ///
    /// # Safety
    /// `p` is a non-null function of the C signature `A` (the driver's export of a
    /// name whose signature the hook table's row declares).
    #[inline(always)]
    pub unsafe fn from_raw(p: *mut c_void) -> Self {
        Real(p, PhantomData)
    }
}

macro_rules! arity {
    ($($t:ident $v:ident),*) => {
        impl<$($t),*> Real<($($t,)*)> {
            #[inline(always)]
            #[allow(clippy::too_many_arguments, dead_code)] // not every arity is hooked
            pub fn call(self, $($v: $t),*) -> CuResult {
                // SAFETY: `self.0` is a function of this C signature (`from_raw`), and a
                // function pointer has a data pointer's size. The arguments are the typed
                // ones of that signature: the program's own, forwarded, or the shim's
                // valid ones (an `Out` of its own variable).
                unsafe {
                    let f = std::mem::transmute_copy::<*mut c_void, unsafe extern "C" fn($($t),*) -> CuResult>(&self.0);
                    f($($v),*)
                }
            }
        }
    };
}

arity!();
arity!(A a);
arity!(A a, B b);
arity!(A a, B b, C c);
arity!(A a, B b, C c, D d);
arity!(A a, B b, C c, D d, E e);
arity!(A a, B b, C c, D d, E e, F f);
arity!(A a, B b, C c, D d, E e, F f, G g);
arity!(A a, B b, C c, D d, E e, F f, G g, H h);
arity!(A a, B b, C c, D d, E e, F f, G g, H h, I i);
arity!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j);
arity!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k);
