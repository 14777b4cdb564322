//! `gpucap cdi generate`: the spec and the device's files `crate::cdi` makes, for this
//! gpucap executable and the libgpucap.so found beside it.

use crate::cdi::{Request, generate};
use crate::exit::EXIT_USAGE;
use crate::preload;
use crate::term::print_out;

/// `gpucap cdi generate`: the device's files and the spec, from this gpucap and its
/// libgpucap.so (GPUCAP_LIB names another).
pub fn command(request: &Request) -> i32 {
    let exe = std::env::current_exe().ok();
    let written = exe
        .as_deref()
        .ok_or_else(|| "cannot tell where the gpucap executable is".to_string())
        .and_then(|exe| {
            let lib =
                preload::locate_library(std::env::var_os("GPUCAP_LIB").as_deref(), Some(exe))?;
            generate(request, exe, &lib)
        });
    match written {
        Ok(text) => {
            print_out(&text);
            0
        }
        Err(e) => {
            eprintln!("gpucap: {e}");
            EXIT_USAGE
        }
    }
}
