//! How every view that lists capped processes (`status`, `status --pool`, `top`) shows a
//! cap that is a ceiling handed down to a process (a `gpucap.env` file's or a driver's
//! hand-over, which its environment cannot raise): the figure marked [`MARK`], and under
//! the table one line per place such ceilings came from, naming the processes.

/// Marks a cap that is a ceiling handed down.
pub const MARK: char = '^';

/// One line per place ceilings were handed down from, in the order first met, each
/// with the pids held at one (sorted, each once): `pairs` are (where from, pid).
pub fn notes<'a>(pairs: impl IntoIterator<Item = (&'a str, u32)>) -> Vec<String> {
    let mut from: Vec<(&str, Vec<u32>)> = Vec::new();
    for (f, pid) in pairs {
        match from.iter_mut().find(|(x, _)| *x == f) {
            Some((_, pids)) if !pids.contains(&pid) => pids.push(pid),
            Some(_) => {}
            None => from.push((f, vec![pid])),
        }
    }
    from.into_iter()
        .map(|(f, mut pids)| {
            pids.sort_unstable();
            let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
            format!(
                "{MARK} the cap is a ceiling from {f} (pid {})",
                pids.join(", ")
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_per_source_with_its_pids_once_and_sorted() {
        let got = notes([
            ("/etc/gpucap/gpucap.env", 30),
            ("HAMi device plugin's hand-over", 5),
            ("/etc/gpucap/gpucap.env", 10),
            ("/etc/gpucap/gpucap.env", 30),
        ]);
        assert_eq!(
            got,
            [
                "^ the cap is a ceiling from /etc/gpucap/gpucap.env (pid 10, 30)",
                "^ the cap is a ceiling from HAMi device plugin's hand-over (pid 5)",
            ]
        );
        assert!(notes([]).is_empty());
    }
}
