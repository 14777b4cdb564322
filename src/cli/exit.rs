//! How a command ends: the exit statuses of the CLI, and the one a shell would give
//! for a program that cannot be executed.

use std::ffi::OsStr;
use std::io;

/// Exit status for a usage or configuration error (nothing was run).
pub const EXIT_USAGE: i32 = 2;
/// Exit status when CMD exists but cannot be executed (as in a shell).
pub const EXIT_CANNOT_EXECUTE: i32 = 126;
/// Exit status when CMD is not found (as in a shell).
pub const EXIT_NOT_FOUND: i32 = 127;

/// The exit status and message for a failed exec of `program`, as a shell would give:
/// 127 when it does not exist, 126 when it exists but cannot be executed.
pub fn exec_failure(program: &OsStr, err: &io::Error) -> (i32, String) {
    let name = program.to_string_lossy();
    let has_slash = program.to_string_lossy().contains('/');
    match err.kind() {
        io::ErrorKind::NotFound if !has_slash => {
            (EXIT_NOT_FOUND, format!("gpucap: {name}: command not found"))
        }
        io::ErrorKind::NotFound => (EXIT_NOT_FOUND, format!("gpucap: {name}: {err}")),
        _ => (
            EXIT_CANNOT_EXECUTE,
            format!("gpucap: {name}: cannot execute: {err}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;

    use super::*;

    #[test]
    fn exec_failures_like_a_shell() {
        let nf = io::Error::from(io::ErrorKind::NotFound);
        let (code, msg) = exec_failure(OsStr::new("nosuchcmd"), &nf);
        assert_eq!(code, 127);
        assert_eq!(msg, "gpucap: nosuchcmd: command not found");
        let (code, msg) = exec_failure(OsStr::new("./nosuch"), &nf);
        assert_eq!(code, 127);
        assert!(msg.starts_with("gpucap: ./nosuch: "));
        let denied = io::Error::from_raw_os_error(libc::EACCES);
        assert_eq!(exec_failure(OsStr::new("./file.txt"), &denied).0, 126);
        let noexec = io::Error::from_raw_os_error(libc::ENOEXEC);
        assert_eq!(exec_failure(OsStr::new("./data"), &noexec).0, 126);
    }

    #[test]
    fn real_exec_failures() {
        // exec only returns on failure, so these are safe to run in the test process.
        let err = std::process::Command::new("gpucap-no-such-command-xyz").exec();
        assert_eq!(
            exec_failure(OsStr::new("gpucap-no-such-command-xyz"), &err).0,
            127
        );
        let dir = std::env::temp_dir().join(format!("gpucap-exec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("not-executable");
        std::fs::write(&file, b"hello").unwrap();
        let err = std::process::Command::new(&file).exec();
        assert_eq!(exec_failure(file.as_os_str(), &err).0, 126);
        let err = std::process::Command::new(&dir).exec();
        assert_eq!(exec_failure(dir.as_os_str(), &err).0, 126);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
