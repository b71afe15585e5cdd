// Q4_K super-block (144 bytes, 256 weights): f16 d, f16 dmin, 12 bytes of packed 6-bit (scale, min) pairs for
// 8 sub-blocks of 32, then 128 bytes of nibbles: sub-blocks 2i and 2i+1 are the low and high nibbles of bytes
// 32i..32i+31. One unit is one sub-block: w = d * scale * q - dmin * min.
const UNIT: u32 = 32u;

fn unit_values(base: u32, u: u32) -> array<f32, UNIT> {
    let o = base + 144u * (u >> 3u);
    let j = u & 7u;
    let s = o + 4u;
    var sc: u32;
    var mn: u32;
    if (j < 4u) {
        sc = byte_at(s + j) & 63u;
        mn = byte_at(s + j + 4u) & 63u;
    } else {
        sc = (byte_at(s + j + 4u) & 15u) | ((byte_at(s + j - 4u) >> 6u) << 4u);
        mn = (byte_at(s + j + 4u) >> 4u) | ((byte_at(s + j) >> 6u) << 4u);
    }
    let scale = half_at(o) * f32(sc);
    let offset = half_at(o + 2u) * f32(mn);
    let q0 = o + 16u + 32u * (j >> 1u);  // word-aligned: 144-byte blocks in rows of whole blocks
    let shift = (j & 1u) * 4u;
    var v: array<f32, UNIT>;
    for (var i = 0u; i < 8u; i++) {
        let word = w[(q0 >> 2u) + i] >> shift;
        for (var b = 0u; b < 4u; b++) {
            v[4u * i + b] = scale * f32((word >> (8u * b)) & 15u) - offset;
        }
    }
    return v;
}
