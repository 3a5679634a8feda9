// The expansion of `#[model] type TinyBlock = kiln_models::gpt::GptBlock<16, 2>;`: a
// block with named sizes, holding a `CausalSelfAttention<D, H>` (see macros/src/snapshot.rs).
///`GptBlock` with D = 16, H = 2.
struct TinyBlock<Be: ::kiln::tensor::Backend> {
    ln1: ::kiln::tensor::nn::LayerNorm<Be, 16>,
    attn: __kiln_TinyBlock::CausalSelfAttention__16_2<Be>,
    ln2: ::kiln::tensor::nn::LayerNorm<Be, 16>,
    up: ::kiln::tensor::nn::Linear<Be, 16, 64>,
    down: ::kiln::tensor::nn::Linear<Be, 64, 16>,
    drop: ::kiln::tensor::nn::Dropout<Be, 10>,
    #[doc(hidden)]
    pub __kiln_seeds: ::kiln::tensor::nn::StepSeeds<Be>,
    #[doc(hidden)]
    pub __kiln_plans: ::kiln::fusion::Programs<Be>,
}
///Gradients of every parameter of [`TinyBlock`], field for field.
struct TinyBlockGrads<Be: ::kiln::tensor::Backend> {
    ///Gradients of `ln1`.
    pub ln1: <::kiln::tensor::nn::LayerNorm<
        Be,
        16,
    > as ::kiln::tensor::nn::Module<Be>>::Grads,
    ///Gradients of `attn`.
    pub attn: <__kiln_TinyBlock::CausalSelfAttention__16_2<
        Be,
    > as ::kiln::tensor::nn::Module<Be>>::Grads,
    ///Gradients of `ln2`.
    pub ln2: <::kiln::tensor::nn::LayerNorm<
        Be,
        16,
    > as ::kiln::tensor::nn::Module<Be>>::Grads,
    ///Gradients of `up`.
    pub up: <::kiln::tensor::nn::Linear<
        Be,
        16,
        64,
    > as ::kiln::tensor::nn::Module<Be>>::Grads,
    ///Gradients of `down`.
    pub down: <::kiln::tensor::nn::Linear<
        Be,
        64,
        16,
    > as ::kiln::tensor::nn::Module<Be>>::Grads,
    ///Gradients of `drop`.
    pub drop: <::kiln::tensor::nn::Dropout<
        Be,
        10,
    > as ::kiln::tensor::nn::Module<Be>>::Grads,
    #[doc(hidden)]
    pub __kiln_backend: ::core::marker::PhantomData<Be>,
}
impl<Be: ::kiln::tensor::Backend> ::kiln::tensor::nn::Module<Be> for TinyBlock<Be> {
    type Grads = TinyBlockGrads<Be>;
    fn init_named(
        device: &Be::Device,
        seed: u64,
        prefix: &str,
    ) -> ::kiln::tensor::Result<Self> {
        Ok(TinyBlock {
            ln1: ::kiln::tensor::nn::Module::init_named(
                device,
                seed,
                &::kiln::tensor::nn::join(prefix, "ln1"),
            )?,
            attn: ::kiln::tensor::nn::Module::init_named(
                device,
                seed,
                &::kiln::tensor::nn::join(prefix, "attn"),
            )?,
            ln2: ::kiln::tensor::nn::Module::init_named(
                device,
                seed,
                &::kiln::tensor::nn::join(prefix, "ln2"),
            )?,
            up: ::kiln::tensor::nn::Module::init_named(
                device,
                seed,
                &::kiln::tensor::nn::join(prefix, "up"),
            )?,
            down: ::kiln::tensor::nn::Module::init_named(
                device,
                seed,
                &::kiln::tensor::nn::join(prefix, "down"),
            )?,
            drop: ::kiln::tensor::nn::Module::init_named(
                device,
                seed,
                &::kiln::tensor::nn::join(prefix, "drop"),
            )?,
            __kiln_seeds: ::kiln::tensor::nn::StepSeeds::new(seed),
            __kiln_plans: ::core::default::Default::default(),
        })
    }
    fn visit_params(
        &self,
        prefix: &str,
        f: &mut dyn FnMut(::kiln::tensor::nn::Slot<'_, Be>),
    ) {
        self.ln1.visit_params(&::kiln::tensor::nn::join(prefix, "ln1"), f);
        self.attn.visit_params(&::kiln::tensor::nn::join(prefix, "attn"), f);
        self.ln2.visit_params(&::kiln::tensor::nn::join(prefix, "ln2"), f);
        self.up.visit_params(&::kiln::tensor::nn::join(prefix, "up"), f);
        self.down.visit_params(&::kiln::tensor::nn::join(prefix, "down"), f);
        self.drop.visit_params(&::kiln::tensor::nn::join(prefix, "drop"), f);
    }
    fn visit_buffers(
        &self,
        prefix: &str,
        f: &mut dyn FnMut(::kiln::tensor::nn::Slot<'_, Be>),
    ) {
        self.ln1.visit_buffers(&::kiln::tensor::nn::join(prefix, "ln1"), f);
        self.attn.visit_buffers(&::kiln::tensor::nn::join(prefix, "attn"), f);
        self.ln2.visit_buffers(&::kiln::tensor::nn::join(prefix, "ln2"), f);
        self.up.visit_buffers(&::kiln::tensor::nn::join(prefix, "up"), f);
        self.down.visit_buffers(&::kiln::tensor::nn::join(prefix, "down"), f);
        self.drop.visit_buffers(&::kiln::tensor::nn::join(prefix, "drop"), f);
    }
    fn update_params(
        &mut self,
        grads: &Self::Grads,
        prefix: &str,
        f: &mut ::kiln::tensor::nn::UpdateFn<'_, Be>,
    ) -> ::kiln::tensor::Result<()> {
        ::kiln::tensor::nn::with_name(
            prefix,
            "ln1",
            |name| self.ln1.update_params(&grads.ln1, name, f),
        )?;
        ::kiln::tensor::nn::with_name(
            prefix,
            "attn",
            |name| self.attn.update_params(&grads.attn, name, f),
        )?;
        ::kiln::tensor::nn::with_name(
            prefix,
            "ln2",
            |name| self.ln2.update_params(&grads.ln2, name, f),
        )?;
        ::kiln::tensor::nn::with_name(
            prefix,
            "up",
            |name| self.up.update_params(&grads.up, name, f),
        )?;
        ::kiln::tensor::nn::with_name(
            prefix,
            "down",
            |name| self.down.update_params(&grads.down, name, f),
        )?;
        ::kiln::tensor::nn::with_name(
            prefix,
            "drop",
            |name| self.drop.update_params(&grads.drop, name, f),
        )?;
        Ok(())
    }
    fn load_named(
        &mut self,
        prefix: &str,
        get: &mut ::kiln::tensor::nn::LoadFn<'_, Be>,
    ) -> ::kiln::tensor::Result<()> {
        self.ln1.load_named(&::kiln::tensor::nn::join(prefix, "ln1"), get)?;
        self.attn.load_named(&::kiln::tensor::nn::join(prefix, "attn"), get)?;
        self.ln2.load_named(&::kiln::tensor::nn::join(prefix, "ln2"), get)?;
        self.up.load_named(&::kiln::tensor::nn::join(prefix, "up"), get)?;
        self.down.load_named(&::kiln::tensor::nn::join(prefix, "down"), get)?;
        self.drop.load_named(&::kiln::tensor::nn::join(prefix, "drop"), get)?;
        Ok(())
    }
    fn step_seeds(&self) -> ::core::option::Option<&::kiln::tensor::nn::StepSeeds<Be>> {
        ::core::option::Option::Some(&self.__kiln_seeds)
    }
    fn grads_from_raw(
        grads: &mut dyn ::core::iter::Iterator<Item = ::kiln::tensor::RawTensor<Be>>,
    ) -> ::kiln::tensor::Result<Self::Grads> {
        Ok(TinyBlockGrads {
            ln1: <::kiln::tensor::nn::LayerNorm<
                Be,
                16,
            > as ::kiln::tensor::nn::Module<Be>>::grads_from_raw(grads)?,
            attn: <__kiln_TinyBlock::CausalSelfAttention__16_2<
                Be,
            > as ::kiln::tensor::nn::Module<Be>>::grads_from_raw(grads)?,
            ln2: <::kiln::tensor::nn::LayerNorm<
                Be,
                16,
            > as ::kiln::tensor::nn::Module<Be>>::grads_from_raw(grads)?,
            up: <::kiln::tensor::nn::Linear<
                Be,
                16,
                64,
            > as ::kiln::tensor::nn::Module<Be>>::grads_from_raw(grads)?,
            down: <::kiln::tensor::nn::Linear<
                Be,
                64,
                16,
            > as ::kiln::tensor::nn::Module<Be>>::grads_from_raw(grads)?,
            drop: <::kiln::tensor::nn::Dropout<
                Be,
                10,
            > as ::kiln::tensor::nn::Module<Be>>::grads_from_raw(grads)?,
            __kiln_backend: ::core::marker::PhantomData,
        })
    }
}
impl<Be: ::kiln::tensor::Backend> TinyBlock<Be> {
    /// Builds the model on `device`, every parameter initialised from `seed`.
    pub fn init(device: &Be::Device, seed: u64) -> ::kiln::tensor::Result<Self> {
        <Self as ::kiln::tensor::nn::Module<Be>>::init_named(device, seed, "")
    }
    /// Whether methods run through their build-time fused plans (the default).
    pub fn fused(&self) -> bool {
        self.__kiln_plans.fused()
    }
    /// Runs methods through their fused plans (`true`) or op by op (`false`,
    /// the unfused reference path).
    pub fn set_fused(&self, on: bool) {
        self.__kiln_plans.set_fused(on)
    }
    #[doc(hidden)]
    #[inline]
    pub fn __kiln_field_ln1(&self) -> &::kiln::tensor::nn::LayerNorm<Be, 16> {
        &self.ln1
    }
    #[doc(hidden)]
    #[inline]
    pub fn __kiln_field_attn(&self) -> &__kiln_TinyBlock::CausalSelfAttention__16_2<Be> {
        &self.attn
    }
    #[doc(hidden)]
    #[inline]
    pub fn __kiln_field_ln2(&self) -> &::kiln::tensor::nn::LayerNorm<Be, 16> {
        &self.ln2
    }
    #[doc(hidden)]
    #[inline]
    pub fn __kiln_field_up(&self) -> &::kiln::tensor::nn::Linear<Be, 16, 64> {
        &self.up
    }
    #[doc(hidden)]
    #[inline]
    pub fn __kiln_field_down(&self) -> &::kiln::tensor::nn::Linear<Be, 64, 16> {
        &self.down
    }
    #[doc(hidden)]
    #[inline]
    pub fn __kiln_field_drop(&self) -> &::kiln::tensor::nn::Dropout<Be, 10> {
        &self.drop
    }
    /// The seeds the training steps draw random values (dropout masks) with: a
    /// step counter, moved into device memory for a step captured as a graph.
    pub fn step_seeds(&self) -> &::kiln::tensor::nn::StepSeeds<Be> {
        &self.__kiln_seeds
    }
}
#[doc(hidden)]
#[allow(unused_macros)]
macro_rules! __kiln_model_TinyBlock {
    ($($body:tt)*) => {
        ::kiln::__private::model_impl! { #[doc = "`GptBlock` with D = 16, H = 2."] struct
        TinyBlock { ln1 : LayerNorm < 16 >, attn :
        __kiln_TinyBlock::CausalSelfAttention__16_2, ln2 : LayerNorm < 16 >, up : Linear
        < 16, 64 >, down : Linear < 64, 16 >, drop : Dropout < 10 >, }; $($body)* }
    };
}
#[doc(hidden)]
#[allow(unused_imports)]
pub(crate) use __kiln_model_TinyBlock;
impl<Be: ::kiln::tensor::Backend> TinyBlock<Be> {
    #[doc(hidden)]
    pub const __KILN_PLAN_FORWARD: &'static str = "kiln-plan 1\nnode 0 leaf 0 in=[] f32 [1*B;1*T;16]\nnode 1 leaf 1 in=[] f32 [16]\nnode 2 leaf 2 in=[] f32 [16]\nnode 3 op sum{axes=[2]} in=[0] f32 [1*B;1*T;1]\nnode 4 op full{dims=[],value=0.0625,dtype=f32} in=[] f32 []\nnode 5 op mul in=[3;4] f32 [1*B;1*T;1]\nnode 6 op sub in=[0;5] f32 [1*B;1*T;16]\nnode 7 op mul in=[6;6] f32 [1*B;1*T;16]\nnode 8 op sum{axes=[2]} in=[7] f32 [1*B;1*T;1]\nnode 9 op mul in=[8;4] f32 [1*B;1*T;1]\nnode 10 op full{dims=[],value=1e-5,dtype=f32} in=[] f32 []\nnode 11 op add in=[9;10] f32 [1*B;1*T;1]\nnode 12 op rsqrt in=[11] f32 [1*B;1*T;1]\nnode 13 op mul in=[6;12] f32 [1*B;1*T;16]\nnode 14 op mul in=[13;1] f32 [1*B;1*T;16]\nnode 15 op add in=[14;2] f32 [1*B;1*T;16]\nnode 16 leaf 3 in=[] f32 [16;16]\nnode 17 leaf 4 in=[] f32 [16]\nnode 18 op permute{perm=[1;0]} in=[16] f32 [16;16]\nnode 19 op matmul in=[15;18] f32 [1*B;1*T;16]\nnode 20 op add in=[19;17] f32 [1*B;1*T;16]\nnode 21 op reshape{dims=[1*B;1*T;2;8]} in=[20] f32 [1*B;1*T;2;8]\nnode 22 op permute{perm=[0;2;1;3]} in=[21] f32 [1*B;2;1*T;8]\nnode 23 leaf 5 in=[] f32 [16;16]\nnode 24 leaf 6 in=[] f32 [16]\nnode 25 op permute{perm=[1;0]} in=[23] f32 [16;16]\nnode 26 op matmul in=[15;25] f32 [1*B;1*T;16]\nnode 27 op add in=[26;24] f32 [1*B;1*T;16]\nnode 28 op reshape{dims=[1*B;1*T;2;8]} in=[27] f32 [1*B;1*T;2;8]\nnode 29 op permute{perm=[0;2;1;3]} in=[28] f32 [1*B;2;1*T;8]\nnode 30 leaf 7 in=[] f32 [16;16]\nnode 31 leaf 8 in=[] f32 [16]\nnode 32 op permute{perm=[1;0]} in=[30] f32 [16;16]\nnode 33 op matmul in=[15;32] f32 [1*B;1*T;16]\nnode 34 op add in=[33;31] f32 [1*B;1*T;16]\nnode 35 op reshape{dims=[1*B;1*T;2;8]} in=[34] f32 [1*B;1*T;2;8]\nnode 36 op permute{perm=[0;2;1;3]} in=[35] f32 [1*B;2;1*T;8]\nnode 37 op permute{perm=[0;1;3;2]} in=[29] f32 [1*B;2;8;1*T]\nnode 38 op permute{perm=[0;1;3;2]} in=[37] f32 [1*B;2;1*T;8]\nnode 39 op attention{scale=0.35355339059327373,causal=true} in=[22;38;36] f32 [1*B;2;1*T;8]\nnode 40 op permute{perm=[0;2;1;3]} in=[39] f32 [1*B;1*T;2;8]\nnode 41 op reshape{dims=[1*B;1*T;16]} in=[40] f32 [1*B;1*T;16]\nnode 42 leaf 9 in=[] f32 [16;16]\nnode 43 leaf 10 in=[] f32 [16]\nnode 44 op permute{perm=[1;0]} in=[42] f32 [16;16]\nnode 45 op matmul in=[41;44] f32 [1*B;1*T;16]\nnode 46 op add in=[45;43] f32 [1*B;1*T;16]\nnode 47 op add in=[0;46] f32 [1*B;1*T;16]\nnode 48 leaf 11 in=[] f32 [16]\nnode 49 leaf 12 in=[] f32 [16]\nnode 50 op sum{axes=[2]} in=[47] f32 [1*B;1*T;1]\nnode 51 op mul in=[50;4] f32 [1*B;1*T;1]\nnode 52 op sub in=[47;51] f32 [1*B;1*T;16]\nnode 53 op mul in=[52;52] f32 [1*B;1*T;16]\nnode 54 op sum{axes=[2]} in=[53] f32 [1*B;1*T;1]\nnode 55 op mul in=[54;4] f32 [1*B;1*T;1]\nnode 56 op add in=[55;10] f32 [1*B;1*T;1]\nnode 57 op rsqrt in=[56] f32 [1*B;1*T;1]\nnode 58 op mul in=[52;57] f32 [1*B;1*T;16]\nnode 59 op mul in=[58;48] f32 [1*B;1*T;16]\nnode 60 op add in=[59;49] f32 [1*B;1*T;16]\nnode 61 leaf 13 in=[] f32 [64;16]\nnode 62 leaf 14 in=[] f32 [64]\nnode 63 op permute{perm=[1;0]} in=[61] f32 [16;64]\nnode 64 op matmul in=[60;63] f32 [1*B;1*T;64]\nnode 65 op add in=[64;62] f32 [1*B;1*T;64]\nnode 66 op full{dims=[],value=0.7071067811865476,dtype=f32} in=[] f32 []\nnode 67 op mul in=[65;66] f32 [1*B;1*T;64]\nnode 68 op erf in=[67] f32 [1*B;1*T;64]\nnode 69 op full{dims=[],value=1.0,dtype=f32} in=[] f32 []\nnode 70 op add in=[68;69] f32 [1*B;1*T;64]\nnode 71 op full{dims=[],value=0.5,dtype=f32} in=[] f32 []\nnode 72 op mul in=[65;71] f32 [1*B;1*T;64]\nnode 73 op mul in=[72;70] f32 [1*B;1*T;64]\nnode 74 leaf 15 in=[] f32 [16;64]\nnode 75 leaf 16 in=[] f32 [16]\nnode 76 op permute{perm=[1;0]} in=[74] f32 [64;16]\nnode 77 op matmul in=[73;76] f32 [1*B;1*T;16]\nnode 78 op add in=[77;75] f32 [1*B;1*T;16]\nnode 79 op add in=[47;78] f32 [1*B;1*T;16]\ninputs [0;1;2;16;17;23;24;30;31;42;43;48;49;61;62;74;75]\noutputs [79]\nkernel reduce main=3 nodes=[3;4;5] in=[0] out=[5] rows=0\nkernel reduce main=8 nodes=[4;6;7;8;9;10;11;12] in=[0;5] out=[12] rows=0\nkernel elementwise main=- nodes=[6;13;14;15] in=[0;1;2;5;12] out=[15] rows=0\nkernel view main=- nodes=[18] in=[16] out=[18]\nkernel matmul main=19 nodes=[19;20] in=[15;17;18] out=[20]\nkernel view main=- nodes=[21] in=[20] out=[21]\nkernel view main=- nodes=[22] in=[21] out=[22]\nkernel view main=- nodes=[25] in=[23] out=[25]\nkernel matmul main=26 nodes=[26;27] in=[15;24;25] out=[27]\nkernel view main=- nodes=[28] in=[27] out=[28]\nkernel view main=- nodes=[29] in=[28] out=[29]\nkernel view main=- nodes=[32] in=[30] out=[32]\nkernel matmul main=33 nodes=[33;34] in=[15;31;32] out=[34]\nkernel view main=- nodes=[35] in=[34] out=[35]\nkernel view main=- nodes=[36] in=[35] out=[36]\nkernel view main=- nodes=[37] in=[29] out=[37]\nkernel view main=- nodes=[38] in=[37] out=[38]\nkernel single main=- nodes=[39] in=[22;36;38] out=[39]\nkernel view main=- nodes=[40] in=[39] out=[40]\nkernel view main=- nodes=[41] in=[40] out=[41]\nkernel view main=- nodes=[44] in=[42] out=[44]\nkernel matmul main=45 nodes=[45;46;47] in=[0;41;43;44] out=[47]\nkernel reduce main=50 nodes=[4;50;51] in=[47] out=[51] rows=1\nkernel reduce main=54 nodes=[4;10;52;53;54;55;56;57] in=[47;51] out=[57] rows=1\nkernel elementwise main=- nodes=[52;58;59;60] in=[47;48;49;51;57] out=[60] rows=1\nkernel view main=- nodes=[63] in=[61] out=[63]\nkernel matmul main=64 nodes=[64] in=[60;63] out=[64]\nkernel elementwise main=- nodes=[65;66;67;68;69;70;71;72;73] in=[62;64] out=[73]\nkernel view main=- nodes=[76] in=[74] out=[76]\nkernel matmul main=77 nodes=[77;78;79] in=[47;73;75;76] out=[79]\nslot node=5 slot=0\nslot node=12 slot=1\nslot node=15 slot=2\nslot node=20 slot=0\nslot node=21 slot=1\nslot node=27 slot=3\nslot node=28 slot=4\nslot node=34 slot=5\nslot node=35 slot=2\nslot node=39 slot=6\nslot node=41 slot=0\nslot node=47 slot=3\nslot node=51 slot=2\nslot node=57 slot=0\nslot node=60 slot=5\nslot node=64 slot=6\nslot node=73 slot=0\nslot node=79 slot=7\nslots [f32,f32,f32,f32,f32,f32,f32,f32]\nname node=0 x\nname node=1 ln1_weight\nname node=2 ln1_bias\nname node=16 attn_q_weight\nname node=17 attn_q_bias\nname node=22 q\nname node=23 attn_k_weight\nname node=24 attn_k_bias\nname node=29 k\nname node=30 attn_v_weight\nname node=31 attn_v_bias\nname node=36 v\nname node=41 y\nname node=42 attn_proj_weight\nname node=43 attn_proj_bias\nname node=47 h\nname node=48 ln2_weight\nname node=49 ln2_bias\nname node=61 up_weight\nname node=62 up_bias\nname node=74 down_weight\nname node=75 down_bias\nlayer nodes=3..16 ln1\nlayer nodes=16..18 attn\nlayer nodes=18..21 attn.q\nlayer nodes=21..25 attn\nlayer nodes=25..28 attn.k\nlayer nodes=28..32 attn\nlayer nodes=32..35 attn.v\nlayer nodes=35..44 attn\nlayer nodes=44..47 attn.proj\nlayer nodes=50..61 ln2\nlayer nodes=63..66 up\nlayer nodes=76..79 down\n";
    /// `x + attn(ln1(x))`, then the same with the MLP; each branch dropped out by 10%
    /// while training.
    pub fn forward<const B: usize, const T: usize>(
        &self,
        x: &::kiln::tensor::Tensor<
            Be,
            (
                ::kiln::tensor::Const<B>,
                ::kiln::tensor::Const<T>,
                ::kiln::tensor::Const<16>,
            ),
            f32,
        >,
    ) -> ::kiln::tensor::Result<
        ::kiln::tensor::Tensor<
            Be,
            (
                ::kiln::tensor::Const<B>,
                ::kiln::tensor::Const<T>,
                ::kiln::tensor::Const<16>,
            ),
            f32,
        >,
    > {
        ::kiln::tensor::Tensor::from_raw(
            self.__kiln_forward(&[("B", B), ("T", T)], x.raw())?,
        )
    }
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn __kiln_forward(
        &self,
        __sizes: &[(&str, usize)],
        x: &::kiln::tensor::RawTensor<Be>,
    ) -> ::kiln::tensor::Result<::kiln::tensor::RawTensor<Be>> {
        let __dev = x.device().clone();
        let __seed = ::kiln::tensor::nn::StepSeed::Host(0);
        Ok({
            const __KILN_NATIVES: &::kiln::fusion::Natives = &[
                (1, __kiln_natives_TinyBlock::loop_0),
                (2, __kiln_natives_TinyBlock::loop_1),
                (3, __kiln_natives_TinyBlock::loop_2),
                (4, __kiln_natives_TinyBlock::loop_3),
                (9, __kiln_natives_TinyBlock::loop_4),
                (17, __kiln_natives_TinyBlock::loop_4),
                (25, __kiln_natives_TinyBlock::loop_4),
                (43, __kiln_natives_TinyBlock::loop_5),
                (45, __kiln_natives_TinyBlock::loop_0),
                (46, __kiln_natives_TinyBlock::loop_1),
                (47, __kiln_natives_TinyBlock::loop_2),
                (48, __kiln_natives_TinyBlock::loop_3),
                (54, __kiln_natives_TinyBlock::loop_6),
                (59, __kiln_natives_TinyBlock::loop_5),
            ];
            self.__kiln_plans
                .call(
                    0,
                    Self::__KILN_PLAN_FORWARD,
                    __KILN_NATIVES,
                    ::kiln::fusion::RunContext::step(&__dev, __sizes, &__seed),
                    &[
                        x,
                        self.ln1.weight.raw(),
                        self.ln1.bias.raw(),
                        self.attn.__kiln_field_q().weight.raw(),
                        self.attn.__kiln_field_q().bias.raw(),
                        self.attn.__kiln_field_k().weight.raw(),
                        self.attn.__kiln_field_k().bias.raw(),
                        self.attn.__kiln_field_v().weight.raw(),
                        self.attn.__kiln_field_v().bias.raw(),
                        self.attn.__kiln_field_proj().weight.raw(),
                        self.attn.__kiln_field_proj().bias.raw(),
                        self.ln2.weight.raw(),
                        self.ln2.bias.raw(),
                        self.up.weight.raw(),
                        self.up.bias.raw(),
                        self.down.weight.raw(),
                        self.down.bias.raw(),
                    ],
                    |__outs| __outs.next().expect("a plan returns each of its outputs"),
                )?
        })
    }
    /// The build-time fusion plans of this model's methods, as `(method, plan
    /// text)`: the forward methods and the value-and-gradient entries.
    pub fn fusion_plans() -> &'static [(&'static str, &'static str)] {
        &[("TinyBlock::forward", Self::__KILN_PLAN_FORWARD)]
    }
    /// A printout of every fusion plan: kernels, what each fuses, and the bytes
    /// each reads and writes per call (in terms of the size parameters).
    pub fn fusion_report() -> ::kiln::tensor::Result<::std::string::String> {
        ::kiln::fusion::report::report_all(Self::fusion_plans())
    }
    /// Every fusion plan as one Graphviz DOT graph, a cluster per kernel.
    pub fn fusion_dot() -> ::kiln::tensor::Result<::std::string::String> {
        ::kiln::fusion::report::dot_all(Self::fusion_plans())
    }
    ///What [`TinyBlock`] holds, written at build time: each layer and nested model its first method (`forward` if it has one) calls, in call order, with the shape it returns and its parameter count, and the model's total.
    pub fn summary() -> &'static str {
        "TinyBlock: 3,280 parameters; what `forward` calls:\n  layer        type                        output      params\n  ln1          LayerNorm<16>               [B, T, 16]      32\n  attn         CausalSelfAttention<16, 2>  [B, T, 16]   1,088\n    attn.q     Linear<16, 16>              [B, T, 16]     272\n    attn.k     Linear<16, 16>              [B, T, 16]     272\n    attn.v     Linear<16, 16>              [B, T, 16]     272\n    attn.proj  Linear<16, 16>              [B, T, 16]     272\n  drop         Dropout<10>                 [B, T, 16]       0\n  ln2          LayerNorm<16>               [B, T, 16]      32\n  up           Linear<16, 64>              [B, T, 64]   1,088\n  down         Linear<64, 16>              [B, T, 16]   1,040\n  drop         Dropout<10>                 [B, T, 16]       0\n"
    }
}
#[doc(hidden)]
#[allow(non_snake_case)]
mod __kiln_natives_TinyBlock {
    #[allow(unused_imports)]
    use ::kiln::tensor::fused::{
        binary_f32, compare_f32, select_f32, to_bool_f32, unary_f32,
    };
    #[allow(unused_imports)]
    use ::kiln::tensor::{BinaryOp, CmpOp, UnaryOp};
    #[allow(clippy::all, unused_variables)]
    #[inline]
    pub(super) fn loop_0(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        #[inline(always)]
        fn body(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
            let n = outs[0].len();
            let out = &mut outs[0][..n];
            for j in 0..n {
                let r0 = out[j];
                let r1 = f32::from_bits(1031798784u32);
                let r2 = binary_f32(BinaryOp::Mul, r0, r1);
                out[j] = r2;
            }
        }
        ::kiln::tensor::simd::wide(#[inline(always)] || body(ins, outs))
    }
    #[allow(clippy::all, unused_variables)]
    #[inline]
    pub(super) fn loop_1(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        #[inline(always)]
        fn body(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
            let n = outs[0].len();
            let i0 = &ins[0][..n];
            let i1 = &ins[1][..n];
            let out = &mut outs[0][..n];
            for j in 0..n {
                let r0 = i0[j];
                let r1 = i1[j];
                let r2 = binary_f32(BinaryOp::Sub, r0, r1);
                let r3 = binary_f32(BinaryOp::Mul, r2, r2);
                out[j] = r3;
            }
        }
        ::kiln::tensor::simd::wide(#[inline(always)] || body(ins, outs))
    }
    #[allow(clippy::all, unused_variables)]
    #[inline]
    pub(super) fn loop_2(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        #[inline(always)]
        fn body(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
            let n = outs[0].len();
            let out = &mut outs[0][..n];
            for j in 0..n {
                let r0 = out[j];
                let r1 = f32::from_bits(1031798784u32);
                let r2 = binary_f32(BinaryOp::Mul, r0, r1);
                let r3 = f32::from_bits(925353388u32);
                let r4 = binary_f32(BinaryOp::Add, r2, r3);
                let r5 = unary_f32(UnaryOp::Rsqrt, r4);
                out[j] = r5;
            }
        }
        ::kiln::tensor::simd::wide(#[inline(always)] || body(ins, outs))
    }
    #[allow(clippy::all, unused_variables)]
    #[inline]
    pub(super) fn loop_3(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        #[inline(always)]
        fn body(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
            let n = outs[0].len();
            let i0 = &ins[0][..n];
            let i1 = &ins[1][..n];
            let i2 = &ins[2][..n];
            let i3 = &ins[3][..n];
            let i4 = &ins[4][..n];
            let out = &mut outs[0][..n];
            for j in 0..n {
                let r0 = i0[j];
                let r1 = i1[j];
                let r2 = i2[j];
                let r3 = i3[j];
                let r4 = i4[j];
                let r5 = binary_f32(BinaryOp::Sub, r0, r3);
                let r6 = binary_f32(BinaryOp::Mul, r5, r4);
                let r7 = binary_f32(BinaryOp::Mul, r6, r1);
                let r8 = binary_f32(BinaryOp::Add, r7, r2);
                out[j] = r8;
            }
        }
        ::kiln::tensor::simd::wide(#[inline(always)] || body(ins, outs))
    }
    #[allow(clippy::all, unused_variables)]
    #[inline]
    pub(super) fn loop_4(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        #[inline(always)]
        fn body(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
            let n = outs[0].len();
            let i0 = &ins[0][..n];
            let out = &mut outs[0][..n];
            for j in 0..n {
                let r0 = i0[j];
                let r1 = out[j];
                let r2 = binary_f32(BinaryOp::Add, r1, r0);
                out[j] = r2;
            }
        }
        ::kiln::tensor::simd::wide(#[inline(always)] || body(ins, outs))
    }
    #[allow(clippy::all, unused_variables)]
    #[inline]
    pub(super) fn loop_5(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        #[inline(always)]
        fn body(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
            let n = outs[0].len();
            let i0 = &ins[0][..n];
            let i1 = &ins[1][..n];
            let out = &mut outs[0][..n];
            for j in 0..n {
                let r0 = i0[j];
                let r1 = i1[j];
                let r2 = out[j];
                let r3 = binary_f32(BinaryOp::Add, r2, r1);
                let r4 = binary_f32(BinaryOp::Add, r0, r3);
                out[j] = r4;
            }
        }
        ::kiln::tensor::simd::wide(#[inline(always)] || body(ins, outs))
    }
    #[allow(clippy::all, unused_variables)]
    #[inline]
    pub(super) fn loop_6(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        #[inline(always)]
        fn body(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
            let n = outs[0].len();
            let i0 = &ins[0][..n];
            let i1 = &ins[1][..n];
            let out = &mut outs[0][..n];
            for j in 0..n {
                let r0 = i0[j];
                let r1 = i1[j];
                let r2 = binary_f32(BinaryOp::Add, r1, r0);
                let r3 = f32::from_bits(1060439283u32);
                let r4 = binary_f32(BinaryOp::Mul, r2, r3);
                let r5 = unary_f32(UnaryOp::Erf, r4);
                let r6 = f32::from_bits(1065353216u32);
                let r7 = binary_f32(BinaryOp::Add, r5, r6);
                let r8 = f32::from_bits(1056964608u32);
                let r9 = binary_f32(BinaryOp::Mul, r2, r8);
                let r10 = binary_f32(BinaryOp::Mul, r9, r7);
                out[j] = r10;
            }
        }
        ::kiln::tensor::simd::wide(#[inline(always)] || body(ins, outs))
    }
}
#[doc(hidden)]
#[macro_export]
macro_rules! __kiln_def_TinyBlock_8dbee163fc731524 {
    ($($given:tt)*) => {
        ::kiln::__private::model_impl! { $($given)* def { #[doc =
        "`GptBlock` with D = 16, H = 2."] struct TinyBlock { ln1 : LayerNorm < 16 >, attn
        : __kiln_TinyBlock::CausalSelfAttention__16_2, ln2 : LayerNorm < 16 >, up :
        Linear < 16, 64 >, down : Linear < 64, 16 >, drop : Dropout < 10 >, }; impl
        TinyBlock { #[doc =
        " `x + attn(ln1(x))`, then the same with the MLP; each branch dropped out by 10%"]
        #[doc = " while training."] pub fn forward < const B : usize, const T : usize >
        (& self, x : Tensor < B, T, 16 >) -> Tensor < B, T, 16 > { let h = x + self
        .drop(self.attn(self.ln1(x))); h + self.drop(self.down(self.up(self.ln2(h))
        .gelu())) } } } def { #[doc =
        " Causal self-attention of width `D` in `H` heads of `D / H`: queries, keys and"]
        #[doc =
        " values projected, heads split (`reshape` + `permute`), scores scaled by"] #[doc
        =
        " 1/√(D / H), masked (`causal_mask`) and normalised, heads merged and projected."]
        pub struct CausalSelfAttention__16_2 { q : Linear < 16, 16 >, k : Linear < 16, 16
        >, v : Linear < 16, 16 >, proj : Linear < 16, 16 >, }; impl
        CausalSelfAttention__16_2 { #[doc =
        " Each position attends to itself and the positions before it."] pub fn forward <
        const B : usize, const T : usize > (& self, x : Tensor < B, T, 16 >) -> Tensor <
        B, T, 16 > { let q = self.q(x).reshape:: < B, T, 2, 8 > ().permute:: < 0, 2, 1, 3
        > (); let k = self.k(x).reshape:: < B, T, 2, 8 > ().permute:: < 0, 2, 1, 3 > ();
        let v = self.v(x).reshape:: < B, T, 2, 8 > ().permute:: < 0, 2, 1, 3 > (); let
        weights = (q.matmul(k.t()) / 2.8284271247461903).causal_mask().softmax(); let y =
        weights.matmul(v).permute:: < 0, 2, 1, 3 > ().reshape:: < B, T, 16 > (); self
        .proj(y) } #[doc =
        " Mean squared error of the attention's output against `target`."] pub fn loss <
        const B : usize, const T : usize > (& self, x : Tensor < B, T, 16 >, target :
        Tensor < B, T, 16 >,) -> Tensor { self.forward(x).mse(target) } } } }
    };
}
#[doc(hidden)]
#[allow(unused_imports)]
pub use __kiln_def_TinyBlock_8dbee163fc731524 as TinyBlock;
#[doc(hidden)]
#[allow(non_snake_case, non_camel_case_types)]
pub mod __kiln_TinyBlock {
    /// Causal self-attention of width `D` in `H` heads of `D / H`: queries, keys and
    /// values projected, heads split (`reshape` + `permute`), scores scaled by
    /// 1/√(D / H), masked (`causal_mask`) and normalised, heads merged and projected.
    pub struct CausalSelfAttention__16_2<Be: ::kiln::tensor::Backend> {
        q: ::kiln::tensor::nn::Linear<Be, 16, 16>,
        k: ::kiln::tensor::nn::Linear<Be, 16, 16>,
        v: ::kiln::tensor::nn::Linear<Be, 16, 16>,
        proj: ::kiln::tensor::nn::Linear<Be, 16, 16>,
        #[doc(hidden)]
        pub __kiln_seeds: ::kiln::tensor::nn::StepSeeds<Be>,
        #[doc(hidden)]
        pub __kiln_plans: ::kiln::fusion::Programs<Be>,
    }
    ///Gradients of every parameter of [`CausalSelfAttention__16_2`], field for field.
    pub struct CausalSelfAttention__16_2Grads<Be: ::kiln::tensor::Backend> {
        ///Gradients of `q`.
        pub q: <::kiln::tensor::nn::Linear<
            Be,
            16,
            16,
        > as ::kiln::tensor::nn::Module<Be>>::Grads,
        ///Gradients of `k`.
        pub k: <::kiln::tensor::nn::Linear<
            Be,
            16,
            16,
        > as ::kiln::tensor::nn::Module<Be>>::Grads,
        ///Gradients of `v`.
        pub v: <::kiln::tensor::nn::Linear<
            Be,
            16,
            16,
        > as ::kiln::tensor::nn::Module<Be>>::Grads,
        ///Gradients of `proj`.
        pub proj: <::kiln::tensor::nn::Linear<
            Be,
            16,
            16,
        > as ::kiln::tensor::nn::Module<Be>>::Grads,
        #[doc(hidden)]
        pub __kiln_backend: ::core::marker::PhantomData<Be>,
    }
    impl<Be: ::kiln::tensor::Backend> ::kiln::tensor::nn::Module<Be>
    for CausalSelfAttention__16_2<Be> {
        type Grads = CausalSelfAttention__16_2Grads<Be>;
        fn init_named(
            device: &Be::Device,
            seed: u64,
            prefix: &str,
        ) -> ::kiln::tensor::Result<Self> {
            Ok(CausalSelfAttention__16_2 {
                q: ::kiln::tensor::nn::Module::init_named(
                    device,
                    seed,
                    &::kiln::tensor::nn::join(prefix, "q"),
                )?,
                k: ::kiln::tensor::nn::Module::init_named(
                    device,
                    seed,
                    &::kiln::tensor::nn::join(prefix, "k"),
                )?,
                v: ::kiln::tensor::nn::Module::init_named(
                    device,
                    seed,
                    &::kiln::tensor::nn::join(prefix, "v"),
                )?,
                proj: ::kiln::tensor::nn::Module::init_named(
                    device,
                    seed,
                    &::kiln::tensor::nn::join(prefix, "proj"),
                )?,
                __kiln_seeds: ::kiln::tensor::nn::StepSeeds::new(seed),
                __kiln_plans: ::core::default::Default::default(),
            })
        }
        fn visit_params(
            &self,
            prefix: &str,
            f: &mut dyn FnMut(::kiln::tensor::nn::Slot<'_, Be>),
        ) {
            self.q.visit_params(&::kiln::tensor::nn::join(prefix, "q"), f);
            self.k.visit_params(&::kiln::tensor::nn::join(prefix, "k"), f);
            self.v.visit_params(&::kiln::tensor::nn::join(prefix, "v"), f);
            self.proj.visit_params(&::kiln::tensor::nn::join(prefix, "proj"), f);
        }
        fn visit_buffers(
            &self,
            prefix: &str,
            f: &mut dyn FnMut(::kiln::tensor::nn::Slot<'_, Be>),
        ) {
            self.q.visit_buffers(&::kiln::tensor::nn::join(prefix, "q"), f);
            self.k.visit_buffers(&::kiln::tensor::nn::join(prefix, "k"), f);
            self.v.visit_buffers(&::kiln::tensor::nn::join(prefix, "v"), f);
            self.proj.visit_buffers(&::kiln::tensor::nn::join(prefix, "proj"), f);
        }
        fn update_params(
            &mut self,
            grads: &Self::Grads,
            prefix: &str,
            f: &mut ::kiln::tensor::nn::UpdateFn<'_, Be>,
        ) -> ::kiln::tensor::Result<()> {
            ::kiln::tensor::nn::with_name(
                prefix,
                "q",
                |name| self.q.update_params(&grads.q, name, f),
            )?;
            ::kiln::tensor::nn::with_name(
                prefix,
                "k",
                |name| self.k.update_params(&grads.k, name, f),
            )?;
            ::kiln::tensor::nn::with_name(
                prefix,
                "v",
                |name| self.v.update_params(&grads.v, name, f),
            )?;
            ::kiln::tensor::nn::with_name(
                prefix,
                "proj",
                |name| self.proj.update_params(&grads.proj, name, f),
            )?;
            Ok(())
        }
        fn load_named(
            &mut self,
            prefix: &str,
            get: &mut ::kiln::tensor::nn::LoadFn<'_, Be>,
        ) -> ::kiln::tensor::Result<()> {
            self.q.load_named(&::kiln::tensor::nn::join(prefix, "q"), get)?;
            self.k.load_named(&::kiln::tensor::nn::join(prefix, "k"), get)?;
            self.v.load_named(&::kiln::tensor::nn::join(prefix, "v"), get)?;
            self.proj.load_named(&::kiln::tensor::nn::join(prefix, "proj"), get)?;
            Ok(())
        }
        fn step_seeds(
            &self,
        ) -> ::core::option::Option<&::kiln::tensor::nn::StepSeeds<Be>> {
            ::core::option::Option::Some(&self.__kiln_seeds)
        }
        fn grads_from_raw(
            grads: &mut dyn ::core::iter::Iterator<Item = ::kiln::tensor::RawTensor<Be>>,
        ) -> ::kiln::tensor::Result<Self::Grads> {
            Ok(CausalSelfAttention__16_2Grads {
                q: <::kiln::tensor::nn::Linear<
                    Be,
                    16,
                    16,
                > as ::kiln::tensor::nn::Module<Be>>::grads_from_raw(grads)?,
                k: <::kiln::tensor::nn::Linear<
                    Be,
                    16,
                    16,
                > as ::kiln::tensor::nn::Module<Be>>::grads_from_raw(grads)?,
                v: <::kiln::tensor::nn::Linear<
                    Be,
                    16,
                    16,
                > as ::kiln::tensor::nn::Module<Be>>::grads_from_raw(grads)?,
                proj: <::kiln::tensor::nn::Linear<
                    Be,
                    16,
                    16,
                > as ::kiln::tensor::nn::Module<Be>>::grads_from_raw(grads)?,
                __kiln_backend: ::core::marker::PhantomData,
            })
        }
    }
    impl<Be: ::kiln::tensor::Backend> CausalSelfAttention__16_2<Be> {
        /// Builds the model on `device`, every parameter initialised from `seed`.
        pub fn init(device: &Be::Device, seed: u64) -> ::kiln::tensor::Result<Self> {
            <Self as ::kiln::tensor::nn::Module<Be>>::init_named(device, seed, "")
        }
        /// Whether methods run through their build-time fused plans (the default).
        pub fn fused(&self) -> bool {
            self.__kiln_plans.fused()
        }
        /// Runs methods through their fused plans (`true`) or op by op (`false`,
        /// the unfused reference path).
        pub fn set_fused(&self, on: bool) {
            self.__kiln_plans.set_fused(on)
        }
        #[doc(hidden)]
        #[inline]
        pub fn __kiln_field_q(&self) -> &::kiln::tensor::nn::Linear<Be, 16, 16> {
            &self.q
        }
        #[doc(hidden)]
        #[inline]
        pub fn __kiln_field_k(&self) -> &::kiln::tensor::nn::Linear<Be, 16, 16> {
            &self.k
        }
        #[doc(hidden)]
        #[inline]
        pub fn __kiln_field_v(&self) -> &::kiln::tensor::nn::Linear<Be, 16, 16> {
            &self.v
        }
        #[doc(hidden)]
        #[inline]
        pub fn __kiln_field_proj(&self) -> &::kiln::tensor::nn::Linear<Be, 16, 16> {
            &self.proj
        }
        /// The seeds the training steps draw random values (dropout masks) with: a
        /// step counter, moved into device memory for a step captured as a graph.
        pub fn step_seeds(&self) -> &::kiln::tensor::nn::StepSeeds<Be> {
            &self.__kiln_seeds
        }
    }
    #[doc(hidden)]
    #[allow(unused_macros)]
    macro_rules! __kiln_model_CausalSelfAttention__16_2 {
        ($($body:tt)*) => {
            ::kiln::__private::model_impl! { #[doc =
            " Causal self-attention of width `D` in `H` heads of `D / H`: queries, keys and"]
            #[doc =
            " values projected, heads split (`reshape` + `permute`), scores scaled by"]
            #[doc =
            " 1/√(D / H), masked (`causal_mask`) and normalised, heads merged and projected."]
            pub struct CausalSelfAttention__16_2 { q : Linear < 16, 16 >, k : Linear <
            16, 16 >, v : Linear < 16, 16 >, proj : Linear < 16, 16 >, }; $($body)* }
        };
    }
    #[doc(hidden)]
    #[allow(unused_imports)]
    pub(crate) use __kiln_model_CausalSelfAttention__16_2;
}
