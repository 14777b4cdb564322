//! A GPU's index for its UUID (the driver's, asked once), for what the files hold as
//! numbers; users' names are `crate::users`'.

/// GPU indexes by UUID: CUDA's ordinals as this `gpucap` sees them (set
/// `CUDA_DEVICE_ORDER=PCI_BUS_ID` for `nvidia-smi`'s order).
/// Their memory too, where the driver said it.
#[derive(Debug, Clone, Default)]
pub struct Gpus(Vec<([u8; 16], Option<u64>)>);

impl Gpus {
    /// Asks the driver (once; no driver: no index is known).
    pub fn probe() -> Gpus {
        match crate::driver::probe() {
            crate::driver::Probe::Devices(d) => Gpus(
                d.iter()
                    .map(|d| (d.uuid.unwrap_or_default(), Some(d.total)))
                    .collect(),
            ),
            _ => Gpus::default(),
        }
    }

    pub fn from_uuids(uuids: Vec<[u8; 16]>) -> Gpus {
        Gpus(uuids.into_iter().map(|u| (u, None)).collect())
    }

    /// With each GPU's memory in bytes.
    pub fn from_totals(gpus: Vec<([u8; 16], u64)>) -> Gpus {
        Gpus(gpus.into_iter().map(|(u, t)| (u, Some(t))).collect())
    }

    pub fn index(&self, uuid: &[u8; 16]) -> Option<u32> {
        self.0.iter().position(|(u, _)| u == uuid).map(|i| i as u32)
    }

    /// The GPU's memory in bytes, where the driver said it.
    pub fn total(&self, uuid: &[u8; 16]) -> Option<u64> {
        self.0.iter().find(|(u, _)| u == uuid).and_then(|(_, t)| *t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_by_uuid() {
        let g = Gpus::from_uuids(vec![[1; 16], [2; 16]]);
        assert_eq!((g.index(&[2; 16]), g.index(&[3; 16])), (Some(1), None));
    }
}
