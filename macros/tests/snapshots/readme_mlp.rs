// The expansion of the README's `Mlp` (see macros/src/snapshot.rs).
pub struct Mlp<Be: ::kiln::tensor::Backend> {
    fc1: ::kiln::tensor::nn::Linear<Be, 784, 1024>,
    fc2: ::kiln::tensor::nn::Linear<Be, 1024, 1024>,
    fc3: ::kiln::tensor::nn::Linear<Be, 1024, 10>,
    #[doc(hidden)]
    pub __kiln_seeds: ::kiln::tensor::nn::StepSeeds<Be>,
    #[doc(hidden)]
    pub __kiln_plans: ::kiln::fusion::Programs<Be>,
}
///Gradients of every parameter of [`Mlp`], field for field.
pub struct MlpGrads<Be: ::kiln::tensor::Backend> {
    ///Gradients of `fc1`.
    pub fc1: <::kiln::tensor::nn::Linear<
        Be,
        784,
        1024,
    > as ::kiln::tensor::nn::Module<Be>>::Grads,
    ///Gradients of `fc2`.
    pub fc2: <::kiln::tensor::nn::Linear<
        Be,
        1024,
        1024,
    > as ::kiln::tensor::nn::Module<Be>>::Grads,
    ///Gradients of `fc3`.
    pub fc3: <::kiln::tensor::nn::Linear<
        Be,
        1024,
        10,
    > as ::kiln::tensor::nn::Module<Be>>::Grads,
    #[doc(hidden)]
    pub __kiln_backend: ::core::marker::PhantomData<Be>,
}
impl<Be: ::kiln::tensor::Backend> ::kiln::tensor::nn::Module<Be> for Mlp<Be> {
    type Grads = MlpGrads<Be>;
    fn init_named(
        device: &Be::Device,
        seed: u64,
        prefix: &str,
    ) -> ::kiln::tensor::Result<Self> {
        Ok(Mlp {
            fc1: ::kiln::tensor::nn::Module::init_named(
                device,
                seed,
                &::kiln::tensor::nn::join(prefix, "fc1"),
            )?,
            fc2: ::kiln::tensor::nn::Module::init_named(
                device,
                seed,
                &::kiln::tensor::nn::join(prefix, "fc2"),
            )?,
            fc3: ::kiln::tensor::nn::Module::init_named(
                device,
                seed,
                &::kiln::tensor::nn::join(prefix, "fc3"),
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
        self.fc1.visit_params(&::kiln::tensor::nn::join(prefix, "fc1"), f);
        self.fc2.visit_params(&::kiln::tensor::nn::join(prefix, "fc2"), f);
        self.fc3.visit_params(&::kiln::tensor::nn::join(prefix, "fc3"), f);
    }
    fn visit_buffers(
        &self,
        prefix: &str,
        f: &mut dyn FnMut(::kiln::tensor::nn::Slot<'_, Be>),
    ) {
        self.fc1.visit_buffers(&::kiln::tensor::nn::join(prefix, "fc1"), f);
        self.fc2.visit_buffers(&::kiln::tensor::nn::join(prefix, "fc2"), f);
        self.fc3.visit_buffers(&::kiln::tensor::nn::join(prefix, "fc3"), f);
    }
    fn update_params(
        &mut self,
        grads: &Self::Grads,
        prefix: &str,
        f: &mut ::kiln::tensor::nn::UpdateFn<'_, Be>,
    ) -> ::kiln::tensor::Result<()> {
        ::kiln::tensor::nn::with_name(
            prefix,
            "fc1",
            |name| self.fc1.update_params(&grads.fc1, name, f),
        )?;
        ::kiln::tensor::nn::with_name(
            prefix,
            "fc2",
            |name| self.fc2.update_params(&grads.fc2, name, f),
        )?;
        ::kiln::tensor::nn::with_name(
            prefix,
            "fc3",
            |name| self.fc3.update_params(&grads.fc3, name, f),
        )?;
        Ok(())
    }
    fn load_named(
        &mut self,
        prefix: &str,
        get: &mut ::kiln::tensor::nn::LoadFn<'_, Be>,
    ) -> ::kiln::tensor::Result<()> {
        self.fc1.load_named(&::kiln::tensor::nn::join(prefix, "fc1"), get)?;
        self.fc2.load_named(&::kiln::tensor::nn::join(prefix, "fc2"), get)?;
        self.fc3.load_named(&::kiln::tensor::nn::join(prefix, "fc3"), get)?;
        Ok(())
    }
    fn step_seeds(&self) -> ::core::option::Option<&::kiln::tensor::nn::StepSeeds<Be>> {
        ::core::option::Option::Some(&self.__kiln_seeds)
    }
    fn grads_from_raw(
        grads: &mut dyn ::core::iter::Iterator<Item = ::kiln::tensor::RawTensor<Be>>,
    ) -> ::kiln::tensor::Result<Self::Grads> {
        Ok(MlpGrads {
            fc1: <::kiln::tensor::nn::Linear<
                Be,
                784,
                1024,
            > as ::kiln::tensor::nn::Module<Be>>::grads_from_raw(grads)?,
            fc2: <::kiln::tensor::nn::Linear<
                Be,
                1024,
                1024,
            > as ::kiln::tensor::nn::Module<Be>>::grads_from_raw(grads)?,
            fc3: <::kiln::tensor::nn::Linear<
                Be,
                1024,
                10,
            > as ::kiln::tensor::nn::Module<Be>>::grads_from_raw(grads)?,
            __kiln_backend: ::core::marker::PhantomData,
        })
    }
}
impl<Be: ::kiln::tensor::Backend> Mlp<Be> {
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
    pub fn __kiln_field_fc1(&self) -> &::kiln::tensor::nn::Linear<Be, 784, 1024> {
        &self.fc1
    }
    #[doc(hidden)]
    #[inline]
    pub fn __kiln_field_fc2(&self) -> &::kiln::tensor::nn::Linear<Be, 1024, 1024> {
        &self.fc2
    }
    #[doc(hidden)]
    #[inline]
    pub fn __kiln_field_fc3(&self) -> &::kiln::tensor::nn::Linear<Be, 1024, 10> {
        &self.fc3
    }
    /// The seeds the training steps draw random values (dropout masks) with: a
    /// step counter, moved into device memory for a step captured as a graph.
    pub fn step_seeds(&self) -> &::kiln::tensor::nn::StepSeeds<Be> {
        &self.__kiln_seeds
    }
}
#[doc(hidden)]
#[allow(unused_macros)]
macro_rules! __kiln_model_Mlp {
    ($($body:tt)*) => {
        ::kiln::__private::model_impl! { pub struct Mlp { fc1 : Linear < 784, 1024 >, fc2
        : Linear < 1024, 1024 >, fc3 : Linear < 1024, 10 >, }; $($body)* }
    };
}
#[doc(hidden)]
#[allow(unused_imports)]
pub(crate) use __kiln_model_Mlp;
impl<Be: ::kiln::tensor::Backend> Mlp<Be> {
    #[doc(hidden)]
    pub const __KILN_PLAN_FORWARD: &'static str = "kiln-plan 1\nnode 0 leaf 0 in=[] f32 [1*B;784]\nnode 1 leaf 1 in=[] f32 [1024;784]\nnode 2 leaf 2 in=[] f32 [1024]\nnode 3 op permute{perm=[1;0]} in=[1] f32 [784;1024]\nnode 4 op matmul in=[0;3] f32 [1*B;1024]\nnode 5 op add in=[4;2] f32 [1*B;1024]\nnode 6 op relu in=[5] f32 [1*B;1024]\nnode 7 leaf 3 in=[] f32 [1024;1024]\nnode 8 leaf 4 in=[] f32 [1024]\nnode 9 op permute{perm=[1;0]} in=[7] f32 [1024;1024]\nnode 10 op matmul in=[6;9] f32 [1*B;1024]\nnode 11 op add in=[10;8] f32 [1*B;1024]\nnode 12 op relu in=[11] f32 [1*B;1024]\nnode 13 leaf 5 in=[] f32 [10;1024]\nnode 14 leaf 6 in=[] f32 [10]\nnode 15 op permute{perm=[1;0]} in=[13] f32 [1024;10]\nnode 16 op matmul in=[12;15] f32 [1*B;10]\nnode 17 op add in=[16;14] f32 [1*B;10]\ninputs [0;1;2;7;8;13;14]\noutputs [17]\nkernel view main=- nodes=[3] in=[1] out=[3]\nkernel matmul main=4 nodes=[4;5;6] in=[0;2;3] out=[6]\nkernel view main=- nodes=[9] in=[7] out=[9]\nkernel matmul main=10 nodes=[10;11;12] in=[6;8;9] out=[12]\nkernel view main=- nodes=[15] in=[13] out=[15]\nkernel matmul main=16 nodes=[16;17] in=[12;14;15] out=[17]\nslot node=6 slot=0\nslot node=12 slot=1\nslot node=17 slot=2\nslots [f32,f32,f32]\nname node=0 x\nname node=1 fc1_weight\nname node=2 fc1_bias\nname node=6 h\nname node=7 fc2_weight\nname node=8 fc2_bias\nname node=12 h\nname node=13 fc3_weight\nname node=14 fc3_bias\nlayer nodes=3..6 fc1\nlayer nodes=9..12 fc2\nlayer nodes=15..18 fc3\n";
    pub fn forward<const B: usize>(
        &self,
        x: &::kiln::tensor::Tensor<
            Be,
            (::kiln::tensor::Const<B>, ::kiln::tensor::Const<784>),
            f32,
        >,
    ) -> ::kiln::tensor::Result<
        ::kiln::tensor::Tensor<
            Be,
            (::kiln::tensor::Const<B>, ::kiln::tensor::Const<10>),
            f32,
        >,
    > {
        ::kiln::tensor::Tensor::from_raw(self.__kiln_forward(&[("B", B)], x.raw())?)
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
                (3, __kiln_natives_Mlp::loop_0),
                (7, __kiln_natives_Mlp::loop_0),
                (11, __kiln_natives_Mlp::loop_1),
            ];
            self.__kiln_plans
                .call(
                    0,
                    Self::__KILN_PLAN_FORWARD,
                    __KILN_NATIVES,
                    ::kiln::fusion::RunContext::step(&__dev, __sizes, &__seed),
                    &[
                        x,
                        self.fc1.weight.raw(),
                        self.fc1.bias.raw(),
                        self.fc2.weight.raw(),
                        self.fc2.bias.raw(),
                        self.fc3.weight.raw(),
                        self.fc3.bias.raw(),
                    ],
                    |__outs| __outs.next().expect("a plan returns each of its outputs"),
                )?
        })
    }
    #[doc(hidden)]
    pub const __KILN_PLAN_LOSS: &'static str = "kiln-plan 1\nnode 0 leaf 0 in=[] f32 [1*B;784]\nnode 1 leaf 1 in=[] i32 [1*B]\nnode 2 leaf 2 in=[] f32 [1024;784]\nnode 3 leaf 3 in=[] f32 [1024]\nnode 4 op permute{perm=[1;0]} in=[2] f32 [784;1024]\nnode 5 op matmul in=[0;4] f32 [1*B;1024]\nnode 6 op add in=[5;3] f32 [1*B;1024]\nnode 7 op relu in=[6] f32 [1*B;1024]\nnode 8 leaf 4 in=[] f32 [1024;1024]\nnode 9 leaf 5 in=[] f32 [1024]\nnode 10 op permute{perm=[1;0]} in=[8] f32 [1024;1024]\nnode 11 op matmul in=[7;10] f32 [1*B;1024]\nnode 12 op add in=[11;9] f32 [1*B;1024]\nnode 13 op relu in=[12] f32 [1*B;1024]\nnode 14 leaf 6 in=[] f32 [10;1024]\nnode 15 leaf 7 in=[] f32 [10]\nnode 16 op permute{perm=[1;0]} in=[14] f32 [1024;10]\nnode 17 op matmul in=[13;16] f32 [1*B;10]\nnode 18 op add in=[17;15] f32 [1*B;10]\nnode 19 op max{axes=[1]} in=[18] f32 [1*B;1]\nnode 20 op sub in=[18;19] f32 [1*B;10]\nnode 21 op exp in=[20] f32 [1*B;10]\nnode 22 op sum{axes=[1]} in=[21] f32 [1*B;1]\nnode 23 op log in=[22] f32 [1*B;1]\nnode 24 op add in=[23;19] f32 [1*B;1]\nnode 25 op sub in=[18;24] f32 [1*B;10]\nnode 26 op reshape{dims=[1*B;1]} in=[1] i32 [1*B;1]\nnode 27 op gather{axis=1} in=[25;26] f32 [1*B;1]\nnode 28 op sum{axes=[0;1]} in=[27] f32 [1;1]\nnode 29 op reshape{dims=[]} in=[28] f32 []\nnode 30 recip_dim 1*B in=[] f32 []\nnode 31 op mul in=[29;30] f32 []\nnode 32 op full{dims=[],value=-1.0,dtype=f32} in=[] f32 []\nnode 33 op mul in=[31;32] f32 []\ninputs [0;1;2;3;8;9;14;15]\noutputs [33]\nkernel view main=- nodes=[4] in=[2] out=[4]\nkernel matmul main=5 nodes=[5;6;7] in=[0;3;4] out=[7]\nkernel view main=- nodes=[10] in=[8] out=[10]\nkernel matmul main=11 nodes=[11;12;13] in=[7;9;10] out=[13]\nkernel view main=- nodes=[16] in=[14] out=[16]\nkernel matmul main=17 nodes=[17;18] in=[13;15;16] out=[18]\nkernel reduce main=19 nodes=[19] in=[18] out=[19] rows=0\nkernel reduce main=22 nodes=[20;21;22;23;24] in=[18;19] out=[24] rows=0\nkernel elementwise main=- nodes=[25] in=[18;24] out=[25] rows=0\nkernel view main=- nodes=[26] in=[1] out=[26]\nkernel single main=- nodes=[27] in=[25;26] out=[27]\nkernel reduce main=28 nodes=[28] in=[27] out=[28]\nkernel view main=- nodes=[29] in=[28] out=[29]\nkernel elementwise main=- nodes=[30;31;32;33] in=[29] out=[33]\nslot node=7 slot=0\nslot node=13 slot=1\nslot node=18 slot=0\nslot node=19 slot=1\nslot node=24 slot=2\nslot node=25 slot=3\nslot node=26 slot=4\nslot node=27 slot=1\nslot node=28 slot=0\nslot node=29 slot=2\nslot node=33 slot=5\nslots [f32,f32,f32,f32,i32,f32]\nname node=0 x\nname node=1 y\nname node=2 fc1_weight\nname node=3 fc1_bias\nname node=7 h\nname node=8 fc2_weight\nname node=9 fc2_bias\nname node=13 h\nname node=14 fc3_weight\nname node=15 fc3_bias\nlayer nodes=4..7 fc1\nlayer nodes=10..13 fc2\nlayer nodes=16..19 fc3\n";
    pub fn loss<const B: usize>(
        &self,
        x: &::kiln::tensor::Tensor<
            Be,
            (::kiln::tensor::Const<B>, ::kiln::tensor::Const<784>),
            f32,
        >,
        y: &::kiln::tensor::Tensor<Be, (::kiln::tensor::Const<B>,), i32>,
    ) -> ::kiln::tensor::Result<::kiln::tensor::Tensor<Be, (), f32>> {
        ::kiln::tensor::Tensor::from_raw(
            self.__kiln_loss(&[("B", B)], x.raw(), y.raw())?,
        )
    }
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn __kiln_loss(
        &self,
        __sizes: &[(&str, usize)],
        x: &::kiln::tensor::RawTensor<Be>,
        y: &::kiln::tensor::RawTensor<Be>,
    ) -> ::kiln::tensor::Result<::kiln::tensor::RawTensor<Be>> {
        let __dev = x.device().clone();
        let __seed = ::kiln::tensor::nn::StepSeed::Host(0);
        Ok({
            const __KILN_NATIVES: &::kiln::fusion::Natives = &[
                (3, __kiln_natives_Mlp::loop_0),
                (7, __kiln_natives_Mlp::loop_0),
                (11, __kiln_natives_Mlp::loop_1),
                (14, __kiln_natives_Mlp::loop_2),
                (15, __kiln_natives_Mlp::loop_3),
                (16, __kiln_natives_Mlp::loop_4),
            ];
            self.__kiln_plans
                .call(
                    2,
                    Self::__KILN_PLAN_LOSS,
                    __KILN_NATIVES,
                    ::kiln::fusion::RunContext::step(&__dev, __sizes, &__seed),
                    &[
                        x,
                        y,
                        self.fc1.weight.raw(),
                        self.fc1.bias.raw(),
                        self.fc2.weight.raw(),
                        self.fc2.bias.raw(),
                        self.fc3.weight.raw(),
                        self.fc3.bias.raw(),
                    ],
                    |__outs| __outs.next().expect("a plan returns each of its outputs"),
                )?
        })
    }
    #[doc(hidden)]
    pub const __KILN_PLAN_LOSS_AND_GRAD: &'static str = "kiln-plan 1\nnode 0 leaf 0 in=[] f32 [1*B;784]\nnode 1 leaf 1 in=[] i32 [1*B]\nnode 2 leaf 2 in=[] f32 [1024;784]\nnode 3 leaf 3 in=[] f32 [1024]\nnode 4 op permute{perm=[1;0]} in=[2] f32 [784;1024]\nnode 5 op matmul in=[0;4] f32 [1*B;1024]\nnode 6 op add in=[5;3] f32 [1*B;1024]\nnode 7 op relu in=[6] f32 [1*B;1024]\nnode 8 leaf 4 in=[] f32 [1024;1024]\nnode 9 leaf 5 in=[] f32 [1024]\nnode 10 op permute{perm=[1;0]} in=[8] f32 [1024;1024]\nnode 11 op matmul in=[7;10] f32 [1*B;1024]\nnode 12 op add in=[11;9] f32 [1*B;1024]\nnode 13 op relu in=[12] f32 [1*B;1024]\nnode 14 leaf 6 in=[] f32 [10;1024]\nnode 15 leaf 7 in=[] f32 [10]\nnode 16 op permute{perm=[1;0]} in=[14] f32 [1024;10]\nnode 17 op matmul in=[13;16] f32 [1*B;10]\nnode 18 op add in=[17;15] f32 [1*B;10]\nnode 19 op max{axes=[1]} in=[18] f32 [1*B;1]\nnode 20 op sub in=[18;19] f32 [1*B;10]\nnode 21 op exp in=[20] f32 [1*B;10]\nnode 22 op sum{axes=[1]} in=[21] f32 [1*B;1]\nnode 23 op log in=[22] f32 [1*B;1]\nnode 24 op add in=[23;19] f32 [1*B;1]\nnode 25 op sub in=[18;24] f32 [1*B;10]\nnode 26 op reshape{dims=[1*B;1]} in=[1] i32 [1*B;1]\nnode 27 op gather{axis=1} in=[25;26] f32 [1*B;1]\nnode 28 op sum{axes=[0;1]} in=[27] f32 [1;1]\nnode 29 op reshape{dims=[]} in=[28] f32 []\nnode 30 recip_dim 1*B in=[] f32 []\nnode 31 op mul in=[29;30] f32 []\nnode 32 op full{dims=[],value=-1.0,dtype=f32} in=[] f32 []\nnode 33 op mul in=[31;32] f32 []\nnode 34 op full{dims=[],value=1.0,dtype=f32} in=[] f32 []\nnode 35 op mul in=[34;32] f32 []\nnode 36 op mul in=[35;30] f32 []\nnode 37 op reshape{dims=[1;1]} in=[36] f32 [1;1]\nnode 38 op expand{dims=[1*B;1]} in=[37] f32 [1*B;1]\nnode 39 op scatter_add{axis=1,dims=[1*B;10]} in=[26;38] f32 [1*B;10]\nnode 40 op neg in=[39] f32 [1*B;10]\nnode 41 op sum{axes=[1]} in=[40] f32 [1*B;1]\nnode 42 op reshape{dims=[1*B;1]} in=[41] f32 [1*B;1]\nnode 43 op div in=[42;22] f32 [1*B;1]\nnode 44 op expand{dims=[1*B;10]} in=[43] f32 [1*B;10]\nnode 45 op mul in=[44;21] f32 [1*B;10]\nnode 46 op neg in=[45] f32 [1*B;10]\nnode 47 op sum{axes=[1]} in=[46] f32 [1*B;1]\nnode 48 op reshape{dims=[1*B;1]} in=[47] f32 [1*B;1]\nnode 49 op add in=[39;45] f32 [1*B;10]\nnode 50 op add in=[42;48] f32 [1*B;1]\nnode 51 op eq in=[18;19] bool [1*B;10]\nnode 52 op cast{dtype=f32} in=[51] f32 [1*B;10]\nnode 53 op sum{axes=[1]} in=[52] f32 [1*B;1]\nnode 54 op div in=[50;53] f32 [1*B;1]\nnode 55 op mul in=[52;54] f32 [1*B;10]\nnode 56 op add in=[49;55] f32 [1*B;10]\nnode 57 op sum{axes=[0]} in=[56] f32 [1;10]\nnode 58 op reshape{dims=[10]} in=[57] f32 [10]\nnode 59 op permute{perm=[1;0]} in=[16] f32 [10;1024]\nnode 60 op matmul in=[56;59] f32 [1*B;1024]\nnode 61 op permute{perm=[1;0]} in=[13] f32 [1024;1*B]\nnode 62 op permute{perm=[1;0]} in=[56] f32 [10;1*B]\nnode 63 op permute{perm=[1;0]} in=[61] f32 [1*B;1024]\nnode 64 op matmul in=[62;63] f32 [10;1024]\nnode 65 op full{dims=[],value=0.0,dtype=f32} in=[] f32 []\nnode 66 op le in=[12;65] bool [1*B;1024]\nnode 67 op where in=[66;65;60] f32 [1*B;1024]\nnode 68 op sum{axes=[0]} in=[67] f32 [1;1024]\nnode 69 op reshape{dims=[1024]} in=[68] f32 [1024]\nnode 70 op permute{perm=[1;0]} in=[10] f32 [1024;1024]\nnode 71 op matmul in=[67;70] f32 [1*B;1024]\nnode 72 op permute{perm=[1;0]} in=[7] f32 [1024;1*B]\nnode 73 op permute{perm=[1;0]} in=[67] f32 [1024;1*B]\nnode 74 op permute{perm=[1;0]} in=[72] f32 [1*B;1024]\nnode 75 op matmul in=[73;74] f32 [1024;1024]\nnode 76 op le in=[6;65] bool [1*B;1024]\nnode 77 op where in=[76;65;71] f32 [1*B;1024]\nnode 78 op sum{axes=[0]} in=[77] f32 [1;1024]\nnode 79 op reshape{dims=[1024]} in=[78] f32 [1024]\nnode 80 op permute{perm=[1;0]} in=[0] f32 [784;1*B]\nnode 81 op permute{perm=[1;0]} in=[77] f32 [1024;1*B]\nnode 82 op permute{perm=[1;0]} in=[80] f32 [1*B;784]\nnode 83 op matmul in=[81;82] f32 [1024;784]\ninputs [0;1;2;3;8;9;14;15]\noutputs [33;79;83;69;75;58;64]\nkernel view main=- nodes=[4] in=[2] out=[4]\nkernel matmul main=5 nodes=[5] in=[0;4] out=[5]\nkernel elementwise main=- nodes=[6;7] in=[3;5] out=[7]\nkernel view main=- nodes=[10] in=[8] out=[10]\nkernel matmul main=11 nodes=[11] in=[7;10] out=[11]\nkernel elementwise main=- nodes=[12;13] in=[9;11] out=[13]\nkernel view main=- nodes=[16] in=[14] out=[16]\nkernel matmul main=17 nodes=[17;18] in=[13;15;16] out=[18]\nkernel reduce main=19 nodes=[19] in=[18] out=[19] rows=0\nkernel elementwise main=- nodes=[20;21] in=[18;19] out=[21] rows=0\nkernel reduce main=22 nodes=[22] in=[21] out=[22] rows=0\nkernel elementwise main=- nodes=[23;24] in=[19;22] out=[24] rows=0\nkernel elementwise main=- nodes=[25] in=[18;24] out=[25] rows=0\nkernel view main=- nodes=[26] in=[1] out=[26]\nkernel single main=- nodes=[27] in=[25;26] out=[27]\nkernel reduce main=28 nodes=[28] in=[27] out=[28]\nkernel view main=- nodes=[29] in=[28] out=[29]\nkernel elementwise main=- nodes=[30;31;32;33] in=[29] out=[33]\nkernel elementwise main=- nodes=[30;32;34;35;36] in=[] out=[36]\nkernel view main=- nodes=[37] in=[36] out=[37]\nkernel view main=- nodes=[38] in=[37] out=[38]\nkernel single main=- nodes=[39] in=[26;38] out=[39]\nkernel reduce main=41 nodes=[40;41] in=[39] out=[41] rows=1\nkernel view main=- nodes=[42] in=[41] out=[42] rows=1\nkernel elementwise main=- nodes=[43] in=[22;42] out=[43] rows=1\nkernel view main=- nodes=[44] in=[43] out=[44] rows=1\nkernel reduce main=47 nodes=[45;46;47] in=[21;44] out=[47] rows=1\nkernel view main=- nodes=[48] in=[47] out=[48]\nkernel elementwise main=- nodes=[51;52] in=[18;19] out=[52] rows=2\nkernel reduce main=53 nodes=[50;53;54] in=[42;48;52] out=[54] rows=2\nkernel elementwise main=- nodes=[45;49;55;56] in=[21;39;44;52;54] out=[56] rows=2\nkernel reduce main=57 nodes=[57] in=[56] out=[57]\nkernel view main=- nodes=[58] in=[57] out=[58]\nkernel view main=- nodes=[59] in=[16] out=[59]\nkernel view main=- nodes=[61] in=[13] out=[61]\nkernel view main=- nodes=[62] in=[56] out=[62]\nkernel view main=- nodes=[63] in=[61] out=[63]\nkernel matmul main=64 nodes=[64] in=[62;63] out=[64]\nkernel matmul main=60 nodes=[12;60;65;66;67] in=[9;11;56;59] out=[67]\nkernel reduce main=68 nodes=[68] in=[67] out=[68]\nkernel view main=- nodes=[69] in=[68] out=[69]\nkernel view main=- nodes=[70] in=[10] out=[70]\nkernel view main=- nodes=[72] in=[7] out=[72]\nkernel view main=- nodes=[73] in=[67] out=[73]\nkernel view main=- nodes=[74] in=[72] out=[74]\nkernel matmul main=75 nodes=[75] in=[73;74] out=[75]\nkernel matmul main=71 nodes=[6;65;71;76;77] in=[3;5;67;70] out=[77]\nkernel reduce main=78 nodes=[78] in=[77] out=[78]\nkernel view main=- nodes=[79] in=[78] out=[79]\nkernel view main=- nodes=[80] in=[0] out=[80]\nkernel view main=- nodes=[81] in=[77] out=[81]\nkernel view main=- nodes=[82] in=[80] out=[82]\nkernel matmul main=83 nodes=[83] in=[81;82] out=[83]\nslot node=5 slot=0\nslot node=7 slot=1\nslot node=11 slot=2\nslot node=13 slot=3\nslot node=18 slot=4\nslot node=19 slot=5\nslot node=21 slot=6\nslot node=22 slot=7\nslot node=24 slot=8\nslot node=25 slot=9\nslot node=26 slot=10\nslot node=27 slot=8\nslot node=28 slot=9\nslot node=29 slot=8\nslot node=33 slot=11\nslot node=36 slot=8\nslot node=37 slot=9\nslot node=39 slot=12\nslot node=41 slot=8\nslot node=42 slot=9\nslot node=43 slot=13\nslot node=47 slot=14\nslot node=48 slot=7\nslot node=52 slot=15\nslot node=54 slot=16\nslot node=56 slot=17\nslot node=57 slot=18\nslot node=58 slot=19\nslot node=64 slot=20\nslot node=67 slot=3\nslot node=68 slot=21\nslot node=69 slot=22\nslot node=75 slot=23\nslot node=77 slot=2\nslot node=78 slot=24\nslot node=79 slot=25\nslot node=83 slot=26\nslots [f32,f32,f32,f32,f32,f32,f32,f32,f32,f32,i32,f32,f32,f32,f32,f32,f32,f32,f32,f32,f32,f32,f32,f32,f32,f32,f32]\nname node=0 x\nname node=1 y\nname node=2 fc1_weight\nname node=3 fc1_bias\nname node=7 h\nname node=8 fc2_weight\nname node=9 fc2_bias\nname node=13 h\nname node=14 fc3_weight\nname node=15 fc3_bias\nname node=33 loss\nname node=34 d_loss\nname node=58 d_fc3_bias\nname node=60 d_h\nname node=64 d_fc3_weight\nname node=69 d_fc2_bias\nname node=71 d_h\nname node=75 d_fc2_weight\nname node=79 d_fc1_bias\nname node=83 d_fc1_weight\nlayer nodes=4..7 fc1\nlayer nodes=10..13 fc2\nlayer nodes=16..19 fc3\nlayer nodes=57..65 fc3\nlayer nodes=68..76 fc2\nlayer nodes=78..84 fc1\n";
    ///The value of [`Self::loss`] and the gradient of every parameter, computed by the backward pass `#[model]` derived at build time (training mode: dropout active, batch statistics used and recorded).
    pub fn loss_and_grad<const B: usize>(
        &self,
        x: &::kiln::tensor::Tensor<
            Be,
            (::kiln::tensor::Const<B>, ::kiln::tensor::Const<784>),
            f32,
        >,
        y: &::kiln::tensor::Tensor<Be, (::kiln::tensor::Const<B>,), i32>,
    ) -> ::kiln::tensor::Result<(::kiln::tensor::Tensor<Be, (), f32>, MlpGrads<Be>)> {
        let (loss, grads) = self.__kiln_loss_and_grad(&[("B", B)], x.raw(), y.raw())?;
        Ok((::kiln::tensor::Tensor::from_raw(loss)?, grads))
    }
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments, clippy::redundant_clone)]
    fn __kiln_loss_and_grad(
        &self,
        __sizes: &[(&str, usize)],
        x: &::kiln::tensor::RawTensor<Be>,
        y: &::kiln::tensor::RawTensor<Be>,
    ) -> ::kiln::tensor::Result<(::kiln::tensor::RawTensor<Be>, MlpGrads<Be>)> {
        let __dev = x.device().clone();
        let __seed = self.__kiln_seeds.next();
        let (
            loss,
            d_fc1_bias,
            d_fc1_weight,
            d_fc2_bias,
            d_fc2_weight,
            d_fc3_bias,
            d_fc3_weight,
        ) = {
            const __KILN_NATIVES: &::kiln::fusion::Natives = &[
                (4, __kiln_natives_Mlp::loop_5),
                (10, __kiln_natives_Mlp::loop_5),
                (15, __kiln_natives_Mlp::loop_1),
                (18, __kiln_natives_Mlp::loop_2),
                (22, __kiln_natives_Mlp::loop_6),
                (24, __kiln_natives_Mlp::loop_4),
                (44, __kiln_natives_Mlp::loop_7),
                (48, __kiln_natives_Mlp::loop_8),
                (52, __kiln_natives_Mlp::loop_9),
                (56, __kiln_natives_Mlp::loop_10),
                (59, __kiln_natives_Mlp::loop_11),
                (60, __kiln_natives_Mlp::loop_12),
                (77, __kiln_natives_Mlp::loop_13),
                (93, __kiln_natives_Mlp::loop_13),
            ];
            self.__kiln_plans
                .call(
                    3,
                    Self::__KILN_PLAN_LOSS_AND_GRAD,
                    __KILN_NATIVES,
                    ::kiln::fusion::RunContext::step(&__dev, __sizes, &__seed),
                    &[
                        x,
                        y,
                        self.fc1.weight.raw(),
                        self.fc1.bias.raw(),
                        self.fc2.weight.raw(),
                        self.fc2.bias.raw(),
                        self.fc3.weight.raw(),
                        self.fc3.bias.raw(),
                    ],
                    |__outs| (
                        __outs.next().expect("a plan returns each of its outputs"),
                        __outs.next().expect("a plan returns each of its outputs"),
                        __outs.next().expect("a plan returns each of its outputs"),
                        __outs.next().expect("a plan returns each of its outputs"),
                        __outs.next().expect("a plan returns each of its outputs"),
                        __outs.next().expect("a plan returns each of its outputs"),
                        __outs.next().expect("a plan returns each of its outputs"),
                    ),
                )?
        };
        let grads = <Self as ::kiln::tensor::nn::Module<
            Be,
        >>::grads_from_raw(
            &mut [
                d_fc1_weight.clone(),
                d_fc1_bias.clone(),
                d_fc2_weight.clone(),
                d_fc2_bias.clone(),
                d_fc3_weight.clone(),
                d_fc3_bias.clone(),
            ]
                .into_iter(),
        )?;
        Ok((loss, grads))
    }
    /// The build-time fusion plans of this model's methods, as `(method, plan
    /// text)`: the forward methods and the value-and-gradient entries.
    pub fn fusion_plans() -> &'static [(&'static str, &'static str)] {
        &[
            ("Mlp::forward", Self::__KILN_PLAN_FORWARD),
            ("Mlp::loss", Self::__KILN_PLAN_LOSS),
            ("Mlp::loss_and_grad", Self::__KILN_PLAN_LOSS_AND_GRAD),
        ]
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
    ///What [`Mlp`] holds, written at build time: each layer and nested model its first method (`forward` if it has one) calls, in call order, with the shape it returns and its parameter count, and the model's total.
    pub fn summary() -> &'static str {
        "Mlp: 1,863,690 parameters; what `forward` calls:\n  layer  type                output        params\n  fc1    Linear<784, 1024>   [B, 1024]    803,840\n  fc2    Linear<1024, 1024>  [B, 1024]  1,049,600\n  fc3    Linear<1024, 10>    [B, 10]       10,250\n"
    }
}
impl<Be: ::kiln::tensor::Backend> Mlp<Be> {
    #[doc(hidden)]
    fn __kiln_loss_sizes(
        input: &::kiln::tensor::RawTensor<Be>,
        target: &::kiln::tensor::RawTensor<Be>,
    ) -> ::kiln::tensor::Result<::std::vec::Vec<(&'static str, usize)>> {
        Ok({
            use ::kiln::train::learner::DimSpec::*;
            ::kiln::train::learner::bind_sizes(
                "Mlp::loss",
                &[
                    (
                        "x",
                        <f32 as ::kiln::tensor::Element>::DTYPE,
                        &[Param("B"), Lit(784usize)],
                    ),
                    ("y", <i32 as ::kiln::tensor::Element>::DTYPE, &[Param("B")]),
                ],
                &[input, target],
            )?
        })
    }
}
impl<Be: ::kiln::tensor::Backend> ::kiln::train::learner::Supervised<Be> for Mlp<Be> {
    fn loss_and_grads(
        &self,
        input: &::kiln::tensor::RawTensor<Be>,
        target: &::kiln::tensor::RawTensor<Be>,
    ) -> ::kiln::tensor::Result<
        (::kiln::tensor::RawTensor<Be>, <Self as ::kiln::tensor::nn::Module<Be>>::Grads),
    > {
        self.__kiln_loss_and_grad(
            &Self::__kiln_loss_sizes(input, target)?,
            input,
            target,
        )
    }
    fn eval_loss(
        &self,
        input: &::kiln::tensor::RawTensor<Be>,
        target: &::kiln::tensor::RawTensor<Be>,
    ) -> ::kiln::tensor::Result<::kiln::tensor::RawTensor<Be>> {
        self.__kiln_loss(&Self::__kiln_loss_sizes(input, target)?, input, target)
    }
    fn scores(
        &self,
        input: &::kiln::tensor::RawTensor<Be>,
    ) -> ::kiln::tensor::Result<::core::option::Option<::kiln::tensor::RawTensor<Be>>> {
        Ok(
            Some(
                self
                    .__kiln_forward(
                        &{
                            use ::kiln::train::learner::DimSpec::*;
                            ::kiln::train::learner::bind_sizes(
                                "Mlp::forward",
                                &[
                                    (
                                        "x",
                                        <f32 as ::kiln::tensor::Element>::DTYPE,
                                        &[Param("B"), Lit(784usize)],
                                    ),
                                ],
                                &[input],
                            )?
                        },
                        input,
                    )?,
            ),
        )
    }
    fn draws_at_random() -> bool {
        ::kiln::fusion::plan::training_draws(Self::fusion_plans())
    }
}
#[doc(hidden)]
#[allow(non_snake_case)]
mod __kiln_natives_Mlp {
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
            let i0 = &ins[0][..n];
            let out = &mut outs[0][..n];
            for j in 0..n {
                let r0 = i0[j];
                let r1 = out[j];
                let r2 = binary_f32(BinaryOp::Add, r1, r0);
                let r3 = unary_f32(UnaryOp::Relu, r2);
                out[j] = r3;
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
    pub(super) fn loop_2(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
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
                let r3 = unary_f32(UnaryOp::Exp, r2);
                out[j] = r3;
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
            let out = &mut outs[0][..n];
            for j in 0..n {
                let r0 = i0[j];
                let r1 = out[j];
                let r2 = unary_f32(UnaryOp::Log, r1);
                let r3 = binary_f32(BinaryOp::Add, r2, r0);
                out[j] = r3;
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
            let i1 = &ins[1][..n];
            let out = &mut outs[0][..n];
            for j in 0..n {
                let r0 = i0[j];
                let r1 = i1[j];
                let r2 = binary_f32(BinaryOp::Sub, r0, r1);
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
                let r2 = binary_f32(BinaryOp::Add, r1, r0);
                let r3 = unary_f32(UnaryOp::Relu, r2);
                out[j] = r3;
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
                let r2 = unary_f32(UnaryOp::Log, r1);
                let r3 = binary_f32(BinaryOp::Add, r2, r0);
                out[j] = r3;
            }
        }
        ::kiln::tensor::simd::wide(#[inline(always)] || body(ins, outs))
    }
    #[allow(clippy::all, unused_variables)]
    #[inline]
    pub(super) fn loop_7(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        #[inline(always)]
        fn body(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
            let n = outs[0].len();
            let i0 = &ins[0][..n];
            let out = &mut outs[0][..n];
            for j in 0..n {
                let r0 = i0[j];
                let r1 = unary_f32(UnaryOp::Neg, r0);
                out[j] = r1;
            }
        }
        ::kiln::tensor::simd::wide(#[inline(always)] || body(ins, outs))
    }
    #[allow(clippy::all, unused_variables)]
    #[inline]
    pub(super) fn loop_8(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        #[inline(always)]
        fn body(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
            let n = outs[0].len();
            let i0 = &ins[0][..n];
            let i1 = &ins[1][..n];
            let out = &mut outs[0][..n];
            for j in 0..n {
                let r0 = i0[j];
                let r1 = i1[j];
                let r2 = binary_f32(BinaryOp::Div, r1, r0);
                out[j] = r2;
            }
        }
        ::kiln::tensor::simd::wide(#[inline(always)] || body(ins, outs))
    }
    #[allow(clippy::all, unused_variables)]
    #[inline]
    pub(super) fn loop_9(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        #[inline(always)]
        fn body(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
            let n = outs[0].len();
            let i0 = &ins[0][..n];
            let i1 = &ins[1][..n];
            let out = &mut outs[0][..n];
            for j in 0..n {
                let r0 = i0[j];
                let r1 = i1[j];
                let r2 = binary_f32(BinaryOp::Mul, r1, r0);
                let r3 = unary_f32(UnaryOp::Neg, r2);
                out[j] = r3;
            }
        }
        ::kiln::tensor::simd::wide(#[inline(always)] || body(ins, outs))
    }
    #[allow(clippy::all, unused_variables)]
    #[inline]
    pub(super) fn loop_10(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        #[inline(always)]
        fn body(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
            let n = outs[0].len();
            let i0 = &ins[0][..n];
            let i1 = &ins[1][..n];
            let out = &mut outs[0][..n];
            for j in 0..n {
                let r0 = i0[j];
                let r1 = i1[j];
                let r2 = compare_f32(CmpOp::Eq, r0, r1);
                out[j] = r2;
            }
        }
        ::kiln::tensor::simd::wide(#[inline(always)] || body(ins, outs))
    }
    #[allow(clippy::all, unused_variables)]
    #[inline]
    pub(super) fn loop_11(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
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
                let r3 = binary_f32(BinaryOp::Add, r0, r1);
                let r4 = binary_f32(BinaryOp::Div, r3, r2);
                out[j] = r4;
            }
        }
        ::kiln::tensor::simd::wide(#[inline(always)] || body(ins, outs))
    }
    #[allow(clippy::all, unused_variables)]
    #[inline]
    pub(super) fn loop_12(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
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
                let r5 = binary_f32(BinaryOp::Mul, r2, r0);
                let r6 = binary_f32(BinaryOp::Add, r1, r5);
                let r7 = binary_f32(BinaryOp::Mul, r3, r4);
                let r8 = binary_f32(BinaryOp::Add, r6, r7);
                out[j] = r8;
            }
        }
        ::kiln::tensor::simd::wide(#[inline(always)] || body(ins, outs))
    }
    #[allow(clippy::all, unused_variables)]
    #[inline]
    pub(super) fn loop_13(ins: &[&[f32]], outs: &mut [&mut [f32]]) {
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
                let r3 = binary_f32(BinaryOp::Add, r1, r0);
                let r4 = f32::from_bits(0u32);
                let r5 = compare_f32(CmpOp::Le, r3, r4);
                let r6 = select_f32(r5, r4, r2);
                out[j] = r6;
            }
        }
        ::kiln::tensor::simd::wide(#[inline(always)] || body(ins, outs))
    }
}
#[doc(hidden)]
#[macro_export]
macro_rules! __kiln_def_Mlp_303dc8b51d18f486 {
    ($($given:tt)*) => {
        ::kiln::__private::model_impl! { $($given)* def { pub struct Mlp { fc1 : Linear <
        784, 1024 >, fc2 : Linear < 1024, 1024 >, fc3 : Linear < 1024, 10 >, }; impl Mlp
        { pub fn forward < const B : usize > (& self, x : Tensor < B, 784 >) -> Tensor <
        B, 10 > { let h = self.fc1(x).relu(); let h = self.fc2(h).relu(); self.fc3(h) }
        pub fn loss < const B : usize > (& self, x : Tensor < B, 784 >, y : Tensor < B,
        i32 >) -> Tensor { self.forward(x).cross_entropy(y) } } } }
    };
}
#[doc(hidden)]
#[allow(unused_imports)]
pub use __kiln_def_Mlp_303dc8b51d18f486 as Mlp;
