# The torch extension: C++ CPU kernels (always) + CUDA kernels (when nvcc is found), registered
# with TORCH_LIBRARY. Torch is located through the Python that runs the build, not TorchConfig,
# so a CPU-only torch and a CUDA nvcc can be combined (the .cu files include no torch headers).
# REDRAFTER_TORCH_NO_IMPORT=ON reads torch's files without importing it: that checks the build
# against a torch that cannot load here (a CUDA wheel without its NVIDIA libraries, as on the GPU
# image); every torch >= 2.11 wheel for Linux uses the C++11 ABI.
option(REDRAFTER_TORCH_NO_IMPORT "Locate torch from its files without importing it" OFF)
if(REDRAFTER_TORCH_NO_IMPORT)
  set(_torch_probe [=[
import importlib.util, os, re
d = os.path.dirname(importlib.util.find_spec('torch').origin)
print('|'.join([os.path.join(d, 'include'), os.path.join(d, 'include', 'torch', 'csrc', 'api', 'include')]))
print(os.path.join(d, 'lib'))
print(1)
print(re.search(r"__version__ = '([^']+)'", open(os.path.join(d, 'version.py')).read()).group(1))
]=])
else()
  set(_torch_probe [=[
import torch, torch.utils.cpp_extension as e
print('|'.join(e.include_paths())); print('|'.join(e.library_paths()))
print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.__version__)
]=])
endif()
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c "${_torch_probe}"
  OUTPUT_VARIABLE _torch_out RESULT_VARIABLE _torch_rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_rc EQUAL 0)
  set(REDRAFTER_HAVE_TORCH OFF)
  if(REDRAFTER_TORCH STREQUAL "ON")
    message(FATAL_ERROR "REDRAFTER_TORCH=ON but `import torch` failed for ${Python_EXECUTABLE}. "
                        "Install torch first and build with --no-build-isolation.")
  endif()
  message(STATUS "redrafter_ext: torch not found, skipping the torch extension")
  return()
endif()
set(REDRAFTER_HAVE_TORCH ON)
string(REPLACE "\n" ";" _torch_lines "${_torch_out}")
list(GET _torch_lines 0 _torch_inc)
list(GET _torch_lines 1 _torch_libdir)
list(GET _torch_lines 2 _torch_abi)
list(GET _torch_lines 3 _torch_version)
string(REPLACE "|" ";" _torch_inc "${_torch_inc}")
string(REPLACE "|" ";" _torch_libdir "${_torch_libdir}")
message(STATUS "redrafter_ext: torch ${_torch_version} at ${_torch_libdir}")
if(_torch_version VERSION_LESS 2.11)
  message(FATAL_ERROR "redrafter_ext needs torch >= 2.11 (found ${_torch_version})")
endif()

set(REDRAFTER_TORCH_SOURCES
  csrc/torch/module.cpp
  csrc/torch/registration.cpp
  csrc/torch/checks.cpp
  csrc/torch/ops_cpu.cpp
  ${REDRAFTER_CPU_KERNELS}
  csrc/cpu/kv_compact_paged.cpp
  csrc/cpu/skinny_linear.cpp
)

# CUDA: compiled when nvcc is found; the module links cudart statically so it imports anywhere.
set(REDRAFTER_HAVE_CUDA OFF)
if(NOT REDRAFTER_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    set(REDRAFTER_HAVE_CUDA ON)
    list(APPEND REDRAFTER_TORCH_SOURCES csrc/torch/ops_cuda.cpp csrc/cuda/tree_mask.cu csrc/cuda/beam_topk.cu
         csrc/cuda/build_trie.cu csrc/cuda/ngram_lookup.cu csrc/cuda/verify_greedy.cu csrc/cuda/verify_sample.cu
         csrc/cuda/kv_compact.cu csrc/cuda/kv_compact_paged.cu)
  elseif(REDRAFTER_CUDA STREQUAL "ON")
    message(FATAL_ERROR "REDRAFTER_CUDA=ON but no CUDA compiler (nvcc) was found; set CUDACXX")
  else()
    message(STATUS "redrafter_ext: nvcc not found, building without CUDA kernels")
  endif()
endif()

python_add_library(_C MODULE WITH_SOABI USE_SABI 3.10 ${REDRAFTER_TORCH_SOURCES})
target_include_directories(_C PRIVATE ${_torch_inc} ${CMAKE_CURRENT_SOURCE_DIR}/csrc)
target_compile_definitions(_C PRIVATE _GLIBCXX_USE_CXX11_ABI=${_torch_abi} TORCH_EXTENSION_NAME=_C)
target_compile_options(_C PRIVATE
  $<$<COMPILE_LANGUAGE:CXX>:-O3 -Wall -Wno-unused-parameter>
  $<$<COMPILE_LANGUAGE:CUDA>:-O3 -Werror=all-warnings --expt-relaxed-constexpr>)
target_link_directories(_C PRIVATE ${_torch_libdir})
target_link_libraries(_C PRIVATE c10 torch torch_cpu)
# at::parallel_for is a header template: compiled without OpenMP it runs every range on one thread
# (torch's Linux wheels are built with AT_PARALLEL_OPENMP). Only the CPU launchers need it; the
# module then shares the libgomp.so.1 that torch has already loaded.
find_package(OpenMP COMPONENTS CXX)
if(OpenMP_CXX_FOUND)
  set_property(SOURCE csrc/torch/ops_cpu.cpp APPEND PROPERTY COMPILE_OPTIONS ${OpenMP_CXX_FLAGS})
  target_link_libraries(_C PRIVATE OpenMP::OpenMP_CXX)
else()
  message(STATUS "redrafter_ext: OpenMP not found, the CPU kernels run on one thread")
endif()
if(REDRAFTER_HAVE_CUDA)
  target_compile_definitions(_C PRIVATE REDRAFTER_WITH_CUDA=1)
  set_target_properties(_C PROPERTIES CUDA_RUNTIME_LIBRARY Static)
  target_include_directories(_C PRIVATE ${CMAKE_CUDA_TOOLKIT_INCLUDE_DIRECTORIES})
endif()
install(TARGETS _C LIBRARY DESTINATION redrafter_ext)
list(APPEND REDRAFTER_BUILT "torch(cuda=${REDRAFTER_HAVE_CUDA})")
