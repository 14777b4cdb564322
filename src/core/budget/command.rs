//! The command a member shows in its pool (`gpucap status`, `top`, the metrics'
//! `command` label): what names the program, made to fit the pool file's 63 bytes.

use super::layout::COMMAND_BYTES;

/// The command of a process whose `/proc/self/cmdline` is `cmdline` (arguments ending
/// in NULs), as a member stores it: the program's file name without its directory
/// (`/opt/venv/bin/python train.py` shows as `python train.py`), then the arguments,
/// separated by spaces; invalid UTF-8 is replaced. The directory is dropped because
/// the file keeps 63 bytes only: a long install path would otherwise push out the
/// arguments that tell two members apart. Cut to fit, on a character boundary, with
/// `…` as its last character when it was cut.
pub fn member_command(cmdline: &[u8]) -> String {
    let mut words = cmdline
        .split(|&c| c == 0)
        .filter(|a| !a.is_empty())
        .map(String::from_utf8_lossy);
    let Some(program) = words.next() else {
        return String::new();
    };
    // A program named with a trailing slash has no file name: keep it whole.
    let name = match program.trim_end_matches('/').rsplit_once('/') {
        Some((_, name)) if !name.is_empty() => name,
        _ => &program,
    };
    let mut text = name.to_string();
    for w in words {
        text.push(' ');
        text.push_str(&w);
        if text.len() >= COMMAND_BYTES {
            break;
        }
    }
    fit(text)
}

/// `text` cut to at most COMMAND_BYTES - 1 bytes (the file's field ends with a NUL),
/// with `…` last when it was cut.
fn fit(text: String) -> String {
    const MAX: usize = COMMAND_BYTES - 1;
    if text.len() <= MAX {
        return text;
    }
    let mut n = MAX - '…'.len_utf8();
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    format!("{}…", &text[..n])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(words: &[&str]) -> String {
        let mut b = Vec::new();
        for w in words {
            b.extend_from_slice(w.as_bytes());
            b.push(0);
        }
        member_command(&b)
    }

    #[test]
    fn the_program_is_named_by_its_file_name() {
        assert_eq!(
            cmd(&["/opt/venv/bin/python", "train.py"]),
            "python train.py"
        );
        assert_eq!(cmd(&["./script", "alloc:200Mi"]), "script alloc:200Mi");
        assert_eq!(cmd(&["script"]), "script");
        assert_eq!(cmd(&["/"]), "/");
        assert_eq!(cmd(&["dir/"]), "dir/");
        assert_eq!(cmd(&[]), "");
        // Only the program's directory goes; the arguments are as given.
        assert_eq!(cmd(&["/bin/cat", "/etc/hosts"]), "cat /etc/hosts");
    }

    #[test]
    fn a_long_install_path_leaves_the_arguments_whole() {
        let deep = format!("/{}/target/release/ctests/script", "d".repeat(150));
        let c = cmd(&[&deep, "alloc:200Mi", "touch:/tmp/x"]);
        assert_eq!(c, "script alloc:200Mi touch:/tmp/x");
    }

    #[test]
    fn too_long_is_cut_on_a_character_boundary_and_says_so() {
        let c = cmd(&["prog", &"é".repeat(100)]);
        assert!(c.len() < COMMAND_BYTES, "{}", c.len());
        assert!(c.starts_with("prog éé") && c.ends_with('…'), "{c}");
        let exact = "x".repeat(COMMAND_BYTES - 1);
        assert_eq!(cmd(&[&exact]), exact);
        let over = "x".repeat(COMMAND_BYTES);
        let c = cmd(&[&over]);
        assert_eq!(c.len(), COMMAND_BYTES - 1);
        assert!(c.ends_with('…'));
    }

    #[test]
    fn invalid_utf8_is_replaced() {
        assert_eq!(member_command(b"/x/p\xff\0a\0"), "p\u{fffd} a");
    }
}
