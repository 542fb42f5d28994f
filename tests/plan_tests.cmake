# Command-line tests of skewadam-plan; include()d from tests/CMakeLists.txt.
# Each runs the tool once through plan_check.cmake, which checks the exit
# status (0 fine, 1 bad input, 2 bad command line) and fragments of the output.
if(NOT TARGET skewadam-plan)
  return()
endif()

set(_plan_data "${CMAKE_CURRENT_LIST_DIR}/data/plan")
set(_plan_check "${CMAKE_CURRENT_LIST_DIR}/plan_check.cmake")

# skewadam_plan_test(NAME RC ARGS [OUT fragments] [ERR fragments]); lists use '|'.
function(skewadam_plan_test name rc args)
  cmake_parse_arguments(PARSE_ARGV 3 _t "" "OUT;ERR" "")
  add_test(NAME plan.${name}
           COMMAND ${CMAKE_COMMAND} "-DPLAN=$<TARGET_FILE:skewadam-plan>" "-DARGS=${args}" "-DRC=${rc}"
                   "-DOUT_HAS=${_t_OUT}" "-DERR_HAS=${_t_ERR}" -P "${_plan_check}")
endfunction()

# ---- the paper's figures (docs/spec.md §6)
skewadam_plan_test(preset_table 0 "--preset|paper-6.78b"
  OUT "6,784.33 M|12.64 GiB of weights|1.27 GiB|12.6 MB|2.1 MB|0.008 %|SkewAdam                                     1.29 GiB|50.55 GiB|25.27 GiB|25.29 GiB|SkewAdam, bf16 momentum                      698.1 MB|SkewAdam, 8-bit momentum                     362.1 MB")
skewadam_plan_test(preset_json 0 "--preset|paper-6.78b|--json"
  OUT "\"total_params\": 6784327680|\"weights_bytes\": 13569785856|\"skewadam\": 1380800000|\"adamw\": 54274621440|\"one_buffer\": 27137310720|\"uniform\": 27150620672|\"state_bytes\": 12582912|\"state_bytes\": 2097152|\"state_bytes\": 1366119936|\"skewadam_bf16\": 698095104|\"skewadam_8bit\": 362076288")
skewadam_plan_test(preset_rules 0 "--preset|paper-6.78b|--json|--rule|router=experts"
  OUT "\"params\": 0,|\"state_bytes\": 0")
skewadam_plan_test(list_presets 0 "--list-presets" OUT "paper-6.78b")
skewadam_plan_test(help 0 "--help" OUT "--rule|--preset|--json")

# ---- real inputs
skewadam_plan_test(json_inventory 0 "${_plan_data}/small.json|--json"
  OUT "\"total_params\": 92|\"skewadam\": 320|\"adamw\": 736")
skewadam_plan_test(safetensors 0 "${_plan_data}/small.safetensors|--json"
  OUT "\"total_params\": 92|\"weights_bytes\": 208|\"skewadam\": 320|\"expert_momentum\": 512|\"factored_router\": 312|\"adafactor\": 168|\"uniform\": 536")
skewadam_plan_test(safetensors_json_note 0 "${_plan_data}/small.safetensors|--json"
  ERR "left out 1 integer or boolean buffer(s), e.g. 'position_ids' (I64)")
skewadam_plan_test(safetensors_table 0 "${_plan_data}/small.safetensors"
  OUT "left out: 1 integer or boolean buffer(s), e.g. 'position_ids' (I64)")
skewadam_plan_test(sharded_folder 0 "${_plan_data}/sharded|--json" OUT "\"total_params\": 95|\"skewadam\": 300")
skewadam_plan_test(sharded_index 0 "${_plan_data}/sharded/model.safetensors.index.json|--json" OUT "\"total_params\": 95")
skewadam_plan_test(rule_before_input 0 "--rule|embed=router|${_plan_data}/small.json|--json" OUT "\"params\": 40,")

# ---- bad input: exit status 1 and a message naming the problem
skewadam_plan_test(bad_malformed_json 1 "${_plan_data}/bad/malformed.json" ERR "malformed.json: the file is not valid JSON")
skewadam_plan_test(bad_unknown_dtype_json 1 "${_plan_data}/bad/unknown_dtype.json" ERR "unknown dtype 'int4'")
skewadam_plan_test(bad_zero_dim_json 1 "${_plan_data}/bad/zero_dim.json" ERR "dimension 1 is zero")
skewadam_plan_test(bad_negative_dim_json 1 "${_plan_data}/bad/negative_dim.json" ERR "dimension 0 is negative (-2)")
skewadam_plan_test(bad_no_tensors_json 1 "${_plan_data}/bad/no_tensors.json" ERR "no \"tensors\" array")
skewadam_plan_test(bad_duplicate_json 1 "${_plan_data}/bad/duplicate_name.json" ERR "tensor 'a' appears more than once")
skewadam_plan_test(bad_non_utf8_json 1 "${_plan_data}/bad/non_utf8_name.json" ERR "not valid UTF-8")
skewadam_plan_test(bad_header_exceeds_file 1 "${_plan_data}/bad/header_exceeds_file.safetensors"
  ERR "header length 4096 exceeds the file")
skewadam_plan_test(bad_header_absurd 1 "${_plan_data}/bad/header_absurd.safetensors" ERR "is absurd")
skewadam_plan_test(bad_too_short 1 "${_plan_data}/bad/too_short.safetensors" ERR "too short for a safetensors file")
skewadam_plan_test(bad_offsets_out_of_range 1 "${_plan_data}/bad/offsets_out_of_range.safetensors"
  ERR "data_offsets [8, 24] are out of range")
skewadam_plan_test(bad_offsets_size 1 "${_plan_data}/bad/offsets_size_mismatch.safetensors" ERR "span 12 bytes")
skewadam_plan_test(bad_offsets_overlap 1 "${_plan_data}/bad/offsets_overlap.safetensors" ERR "overlap in the data section")
skewadam_plan_test(bad_zero_dim_st 1 "${_plan_data}/bad/zero_dim.safetensors" ERR "dimension 0 is zero")
skewadam_plan_test(bad_unknown_dtype_st 1 "${_plan_data}/bad/unknown_dtype.safetensors" ERR "unknown dtype 'Q4'")
skewadam_plan_test(bad_unsupported_dtype_st 1 "${_plan_data}/bad/unsupported_dtype.safetensors" ERR "unsupported dtype F64")
skewadam_plan_test(bad_non_utf8_st 1 "${_plan_data}/bad/non_utf8_name.safetensors" ERR "not valid UTF-8")
skewadam_plan_test(bad_not_json_st 1 "${_plan_data}/bad/not_json.safetensors" ERR "is not valid JSON")
skewadam_plan_test(bad_missing_file 1 "${_plan_data}/no-such-file.safetensors" ERR "no such file or folder")
skewadam_plan_test(bad_no_rule_matches 1 "--preset|paper-6.78b|--no-default-rules|--rule|experts=experts"
  ERR "tensor 'tok_emb.weight': matches no tier rule")

# ---- bad command lines: exit status 2
skewadam_plan_test(usage_nothing 2 "" ERR "give either input files or --preset")
skewadam_plan_test(usage_both 2 "${_plan_data}/small.json|--preset|paper-6.78b" ERR "give either input files or --preset")
skewadam_plan_test(usage_unknown_preset 2 "--preset|gpt-5" ERR "--preset: unknown preset 'gpt-5'")
skewadam_plan_test(usage_bad_regex 2 "--preset|paper-6.78b|--rule|(=router" ERR "bad regular expression '('")
skewadam_plan_test(usage_bad_tier 2 "--preset|paper-6.78b|--rule|gate=routers" ERR "unknown tier 'routers'")
skewadam_plan_test(usage_no_equals 2 "--preset|paper-6.78b|--rule|gate" ERR "expected REGEX=TIER")
skewadam_plan_test(usage_unknown_option 2 "--preset|paper-6.78b|--frobnicate" ERR "--frobnicate")
