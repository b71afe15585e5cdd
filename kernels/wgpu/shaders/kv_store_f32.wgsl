@group(0) @binding(2) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(3) var<storage, read_write> v_cache: array<f32>;

fn store(dst: u32, k: vec2<f32>, v: vec2<f32>) {
    k_cache[dst] = k.x;
    k_cache[dst + 1u] = k.y;
    v_cache[dst] = v.x;
    v_cache[dst + 1u] = v.y;
}
