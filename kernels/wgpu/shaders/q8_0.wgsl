// Q8_0 block (34 bytes): f16 d, 32 int8 quants; w = d * q.
const UNIT: u32 = 32u;

fn unit_values(base: u32, u: u32) -> array<f32, UNIT> {
    let o = base + 34u * u;
    let d = half_at(o);
    var v: array<f32, UNIT>;
    for (var i = 0u; i < 32u; i++) {
        v[i] = d * sbyte_at(o + 2u + i);
    }
    return v;
}
