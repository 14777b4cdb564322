//! The answer to NVIDIA's cudart integrity check (export table `d4082055-…`, slot 1), at the
//! bottom of the crate (it imports nothing of it; pure and safe).
//!
//! cudart asks the driver for a 16-byte value and compares it with what it computes
//! itself; on a mismatch every runtime call fails with `cudaErrorSoftwareValidityNotEstablished`.
//! The value is an HMAC over MD2 (RFC 2104 over RFC 1319, block size 16) keyed with a fixed
//! 16-byte key, of: the reported driver version, the version cudart passes, the process id,
//! the low 32 bits of `pthread_self()`, the addresses of the cudart interface table, of the
//! integrity table and of the slot function, the time cudart passes, then per device its
//! UUID and PCI domain, bus and device numbers. That this is what cudart computes was
//! learnt from ZLUDA's reverse engineering (vosen/ZLUDA, `dark_api`); the code here is
//! written from RFC 1319 and RFC 2104.

/// RFC 1319's substitution table ("a random permutation of 0..255 constructed from the
/// digits of pi").
const PI_SUBST: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, 98, 167, 5, 243, 192, 199,
    115, 140, 152, 147, 43, 217, 188, 76, 130, 202, 30, 155, 87, 60, 253, 212, 224, 22, 103, 66,
    111, 24, 138, 23, 229, 18, 190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47,
    238, 122, 169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33, 128, 127, 93,
    154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3, 255, 25, 48, 179, 72, 165, 181, 209,
    215, 94, 146, 42, 172, 86, 170, 198, 79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226,
    156, 116, 4, 241, 69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2, 27,
    96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, 85, 71, 163, 35, 221, 81,
    175, 58, 195, 92, 249, 206, 186, 197, 234, 38, 44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205,
    244, 65, 129, 77, 82, 106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, 242, 239, 183, 14,
    102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, 49, 68, 80, 180, 143, 237, 31, 26,
    219, 153, 141, 51, 159, 17, 131, 20,
];

/// An MD2 computation in progress (RFC 1319).
#[derive(Clone)]
pub struct Md2 {
    x: [u8; 48],
    checksum: [u8; 16],
    last: u8,
    block: [u8; 16],
    filled: usize,
}

impl Default for Md2 {
    fn default() -> Self {
        Md2 {
            x: [0; 48],
            checksum: [0; 16],
            last: 0,
            block: [0; 16],
            filled: 0,
        }
    }
}

impl Md2 {
    /// The MD2 "compress" step of one 16-byte block (without the checksum update).
    fn compress(&mut self, block: &[u8; 16]) {
        for (j, &b) in block.iter().enumerate() {
            self.x[16 + j] = b;
            self.x[32 + j] = b ^ self.x[j];
        }
        let mut t = 0u8;
        for round in 0..18u8 {
            for k in 0..48 {
                self.x[k] ^= PI_SUBST[t as usize];
                t = self.x[k];
            }
            t = t.wrapping_add(round);
        }
    }

    fn process_block(&mut self) {
        let block = self.block;
        for (c, &b) in self.checksum.iter_mut().zip(block.iter()) {
            *c ^= PI_SUBST[(b ^ self.last) as usize];
            self.last = *c;
        }
        self.compress(&block);
        self.filled = 0;
    }

    pub fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.block[self.filled] = b;
            self.filled += 1;
            if self.filled == 16 {
                self.process_block();
            }
        }
    }

    pub fn finish(mut self) -> [u8; 16] {
        let pad = (16 - self.filled) as u8;
        self.update(&vec![pad; pad as usize]);
        let checksum = self.checksum;
        self.compress(&checksum);
        let mut out = [0; 16];
        out.copy_from_slice(&self.x[..16]);
        out
    }
}

/// HMAC (RFC 2104) over MD2, whose block is 16 bytes: `key` is one block.
pub fn hmac_md2(key: &[u8; 16], message: &[u8]) -> [u8; 16] {
    let mut inner = Md2::default();
    inner.update(&key.map(|b| b ^ 0x36));
    inner.update(message);
    let inner = inner.finish();
    let mut outer = Md2::default();
    outer.update(&key.map(|b| b ^ 0x5c));
    outer.update(&inner);
    outer.finish()
}

/// cudart's key.
const KEY: [u8; 16] = [
    0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f,
];

/// What cudart mixes into the check (all but the devices).
#[derive(Debug, Clone, Copy)]
pub struct CheckInput {
    pub driver_version: u32,
    pub version: u32,
    pub pid: u32,
    pub thread: u32,
    pub cudart_table: usize,
    pub integrity_table: usize,
    pub function: usize,
    pub unix_seconds: u64,
}

/// One device as the check sees it.
#[derive(Debug, Clone, Copy)]
pub struct CheckDevice {
    pub uuid: [u8; 16],
    pub pci_domain: i32,
    pub pci_bus: i32,
    pub pci_device: i32,
}

/// The 16 bytes cudart expects, as two native-endian u64 (what the slot writes).
pub fn check(input: &CheckInput, devices: &[CheckDevice]) -> [u64; 2] {
    // Versions ending in 0 or 1 are answered with fixed values, not a hash.
    match input.version % 10 {
        0 => return [0x3341181C03CB675C, 0x8ED383AA1F4CD1E8],
        1 => return [0x1841181C03CB675C, 0x8ED383AA1F4CD1E8],
        _ => {}
    }
    let mut msg = Vec::with_capacity(48 + 28 * devices.len());
    msg.extend_from_slice(&input.driver_version.to_ne_bytes());
    msg.extend_from_slice(&input.version.to_ne_bytes());
    msg.extend_from_slice(&input.pid.to_ne_bytes());
    msg.extend_from_slice(&input.thread.to_ne_bytes());
    msg.extend_from_slice(&(input.cudart_table as u64).to_ne_bytes());
    msg.extend_from_slice(&(input.integrity_table as u64).to_ne_bytes());
    msg.extend_from_slice(&(input.function as u64).to_ne_bytes());
    msg.extend_from_slice(&input.unix_seconds.to_ne_bytes());
    for d in devices {
        msg.extend_from_slice(&d.uuid);
        msg.extend_from_slice(&d.pci_domain.to_ne_bytes());
        msg.extend_from_slice(&d.pci_bus.to_ne_bytes());
        msg.extend_from_slice(&d.pci_device.to_ne_bytes());
    }
    let h = hmac_md2(&KEY, &msg);
    [
        u64::from_ne_bytes(h[..8].try_into().unwrap()),
        u64::from_ne_bytes(h[8..].try_into().unwrap()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// RFC 1319's test suite (appendix A.5).
    #[test]
    fn md2_matches_rfc_1319() {
        let cases = [
            ("", "8350e5a3e24c153df2275c9f80692773"),
            ("a", "32ec01ec4a6dac72c0ab96fb34c0b5d1"),
            ("abc", "da853b0d3f88d99b30283a69e6ded6bb"),
            ("message digest", "ab4f496bfb2a530b219ff33031fe06b0"),
            (
                "abcdefghijklmnopqrstuvwxyz",
                "4e8ddff3650292ab5a4108c3aa47940b",
            ),
            (
                "12345678901234567890123456789012345678901234567890123456789012345678901234567890",
                "d5976f79d83d3a0dc9806c3c66f3efd8",
            ),
        ];
        for (input, want) in cases {
            let mut m = Md2::default();
            m.update(input.as_bytes());
            assert_eq!(hex(&m.finish()), want, "MD2({input:?})");
        }
    }

    /// Split updates give the digest of the whole.
    #[test]
    fn md2_updates_compose() {
        let data: Vec<u8> = (0..100u8).collect();
        let mut whole = Md2::default();
        whole.update(&data);
        let mut parts = Md2::default();
        for c in data.chunks(7) {
            parts.update(c);
        }
        assert_eq!(whole.finish(), parts.finish());
    }

    /// HMAC's structure: the outer hash of (key ^ opad) and the inner digest.
    #[test]
    fn hmac_is_outer_of_inner() {
        let key = [7u8; 16];
        let mut inner = Md2::default();
        inner.update(&[7 ^ 0x36; 16]);
        inner.update(b"msg");
        let mut outer = Md2::default();
        outer.update(&[7 ^ 0x5c; 16]);
        outer.update(&inner.finish());
        assert_eq!(hmac_md2(&key, b"msg"), outer.finish());
    }

    /// Every input changes the answer; two devices differ from one.
    #[test]
    fn check_depends_on_every_input() {
        let base = CheckInput {
            driver_version: 13050,
            version: 13052,
            pid: 1234,
            thread: 0xf79c1000,
            cudart_table: 0x7fff_0000_1000,
            integrity_table: 0x7fff_0000_2000,
            function: 0x7fff_0000_3000,
            unix_seconds: 1_800_000_000,
        };
        let dev = CheckDevice {
            uuid: [0xfa; 16],
            pci_domain: 0,
            pci_bus: 1,
            pci_device: 0,
        };
        let a = check(&base, &[dev]);
        let variants = [
            CheckInput {
                driver_version: 13040,
                ..base
            },
            CheckInput {
                version: 13053,
                ..base
            },
            CheckInput { pid: 1235, ..base },
            CheckInput { thread: 1, ..base },
            CheckInput {
                cudart_table: 8,
                ..base
            },
            CheckInput {
                integrity_table: 8,
                ..base
            },
            CheckInput {
                function: 8,
                ..base
            },
            CheckInput {
                unix_seconds: 1,
                ..base
            },
        ];
        for v in variants {
            assert_ne!(check(&v, &[dev]), a, "{v:?}");
        }
        assert_ne!(check(&base, &[dev, dev]), a);
        assert_ne!(check(&base, &[CheckDevice { pci_bus: 2, ..dev }]), a);
        // Versions ending in 0 or 1 get fixed answers.
        let v0 = CheckInput {
            version: 13050,
            ..base
        };
        assert_eq!(check(&v0, &[]), check(&CheckInput { pid: 9, ..v0 }, &[dev]));
    }
}
