//! `gpucap status --json` without a pool: the snapshot as one JSON object on one line
//! (docs/src/watching.md lists its fields).

use crate::procs::Snapshot;

pub fn render(s: &Snapshot) -> String {
    let mut out =
        serde_json::to_string(s).unwrap_or_else(|e| format!("{{\"error\":{:?}}}", e.to_string()));
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procs::tests::{lone, pool};
    use crate::procs::{Gpus, rows};

    #[test]
    fn every_process_pool_and_lone_file() {
        let pools = vec![pool()];
        let lone = vec![lone(99, 5 << 20, None)];
        let s = Snapshot {
            processes: rows(&pools, &lone, 7, &Gpus::from_uuids(vec![[0x11; 16]])),
            pools,
            lone,
            errors: vec!["x: y".into()],
            warnings: vec![],
            gpus: Gpus::default(),
        };
        let text = render(&s);
        assert!(text.ends_with("}\n") && text.lines().count() == 1);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let p = doc["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == 99)
            .unwrap();
        assert_eq!(p["pool"], serde_json::Value::Null);
        assert_eq!(p["gpu"], 0);
        assert_eq!(p["gpu_uuid"], "GPU-11111111-1111-1111-1111-111111111111");
        assert_eq!(p["used"], 5u64 << 20);
        assert_eq!(p["cap"], serde_json::Value::Null);
        assert_eq!(p["refusals"], 2);
        assert_eq!(p["user"], "alice");
        assert_eq!(doc["pools"][0]["name"], "train");
        assert_eq!(doc["pools"][0]["members"].as_array().unwrap().len(), 3);
        assert_eq!(doc["lone"][0]["gpus"][0]["largest_refused"], 600u64 << 20);
        assert_eq!(doc["errors"][0], "x: y");
    }
}
