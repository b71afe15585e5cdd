// An f32 KV cache: [capacity, kv_heads, head_dim] floats.
@group(0) @binding(2) var<storage, read> k_cache: array<f32>;
@group(0) @binding(3) var<storage, read> v_cache: array<f32>;

fn key(e: u32) -> f32 {
    return k_cache[e];
}

fn value(e: u32) -> f32 {
    return v_cache[e];
}
