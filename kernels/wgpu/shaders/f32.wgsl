// F32: one weight per unit.
const UNIT: u32 = 1u;

fn unit_values(base: u32, u: u32) -> array<f32, UNIT> {
    return array<f32, UNIT>(bitcast<f32>(w[(base >> 2u) + u]));
}
