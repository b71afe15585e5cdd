// Q6_K super-block (210 bytes, 256 weights): ql[128] low nibbles, qh[64] high 2-bit pairs, 16 int8 scales
// (one per 16 weights), f16 d. Weight 128n + 32k + l (n < 2, k < 4, l < 32) takes the low (k < 2) or high
// nibble of ql[64n + 32(k & 1) + l] and bits 2k..2k+1 of qh[32n + l]; w = d * scale[8n + 2k + l / 16] * (q - 32).
// One unit is one such run of 32 weights (n, k).
const UNIT: u32 = 32u;

fn unit_values(base: u32, u: u32) -> array<f32, UNIT> {
    let o = base + 210u * (u >> 3u);
    let n = (u >> 2u) & 1u;
    let k = u & 3u;
    let d = half_at(o + 208u);
    let ql = o + 64u * n + 32u * (k & 1u);
    let qh = o + 128u + 32u * n;
    let lo_shift = (k >> 1u) * 4u;
    let hi_shift = 2u * k;
    let s0 = d * sbyte_at(o + 192u + 8u * n + 2u * k);
    let s1 = d * sbyte_at(o + 192u + 8u * n + 2u * k + 1u);
    var v: array<f32, UNIT>;
    for (var l = 0u; l < 32u; l++) {
        let q = ((byte_at(ql + l) >> lo_shift) & 15u) | (((byte_at(qh + l) >> hi_shift) & 3u) << 4u);
        v[l] = select(s1, s0, l < 16u) * (f32(q) - 32.0);
    }
    return v;
}
