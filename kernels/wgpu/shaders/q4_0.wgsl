// Q4_0 block (18 bytes): f16 d, 16 bytes of nibbles (low: weights 0..15, high: 16..31); w = d * (q - 8).
const UNIT: u32 = 32u;

fn unit_values(base: u32, u: u32) -> array<f32, UNIT> {
    let o = base + 18u * u;
    let d = half_at(o);
    var v: array<f32, UNIT>;
    for (var i = 0u; i < 16u; i++) {
        let q = byte_at(o + 2u + i);
        v[i] = d * (f32(q & 15u) - 8.0);
        v[i + 16u] = d * (f32(q >> 4u) - 8.0);
    }
    return v;
}
