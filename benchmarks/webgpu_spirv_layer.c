// A minimal Vulkan layer (VK_LAYER_TC_spvdump) that writes every SPIR-V module an application
// passes to vkCreateShaderModule to $SPV_DUMP_DIR/shader_<n>.spv: what wgpu (naga) hands the
// driver. Built and enabled by benchmarks/webgpu_spirv.py; needs libvulkan-dev (vk_layer.h).
#include <vulkan/vulkan.h>
#include <vulkan/vk_layer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static PFN_vkGetInstanceProcAddr next_gipa;
static PFN_vkGetDeviceProcAddr next_gdpa;
static PFN_vkCreateShaderModule next_csm;
static int counter;

static VKAPI_ATTR VkResult VKAPI_CALL dump_CreateShaderModule(VkDevice d, const VkShaderModuleCreateInfo *ci,
    const VkAllocationCallbacks *a, VkShaderModule *m) {
    const char *dir = getenv("SPV_DUMP_DIR");
    if (dir) {
        char path[1024];
        snprintf(path, sizeof path, "%s/shader_%03d.spv", dir, counter++);
        FILE *f = fopen(path, "wb");
        if (f) { fwrite(ci->pCode, 1, ci->codeSize, f); fclose(f); }
    }
    return next_csm(d, ci, a, m);
}

static VKAPI_ATTR VkResult VKAPI_CALL dump_CreateInstance(const VkInstanceCreateInfo *ci,
    const VkAllocationCallbacks *a, VkInstance *inst) {
    VkLayerInstanceCreateInfo *li = (VkLayerInstanceCreateInfo *)ci->pNext;
    while (li && !(li->sType == VK_STRUCTURE_TYPE_LOADER_INSTANCE_CREATE_INFO && li->function == VK_LAYER_LINK_INFO))
        li = (VkLayerInstanceCreateInfo *)li->pNext;
    if (!li) return VK_ERROR_INITIALIZATION_FAILED;
    next_gipa = li->u.pLayerInfo->pfnNextGetInstanceProcAddr;
    li->u.pLayerInfo = li->u.pLayerInfo->pNext;
    PFN_vkCreateInstance create = (PFN_vkCreateInstance)next_gipa(NULL, "vkCreateInstance");
    return create(ci, a, inst);
}

static VKAPI_ATTR VkResult VKAPI_CALL dump_CreateDevice(VkPhysicalDevice pd, const VkDeviceCreateInfo *ci,
    const VkAllocationCallbacks *a, VkDevice *dev) {
    VkLayerDeviceCreateInfo *li = (VkLayerDeviceCreateInfo *)ci->pNext;
    while (li && !(li->sType == VK_STRUCTURE_TYPE_LOADER_DEVICE_CREATE_INFO && li->function == VK_LAYER_LINK_INFO))
        li = (VkLayerDeviceCreateInfo *)li->pNext;
    if (!li) return VK_ERROR_INITIALIZATION_FAILED;
    PFN_vkGetInstanceProcAddr gipa = li->u.pLayerInfo->pfnNextGetInstanceProcAddr;
    next_gdpa = li->u.pLayerInfo->pfnNextGetDeviceProcAddr;
    li->u.pLayerInfo = li->u.pLayerInfo->pNext;
    PFN_vkCreateDevice create = (PFN_vkCreateDevice)gipa(NULL, "vkCreateDevice");
    VkResult r = create(pd, ci, a, dev);
    if (r == VK_SUCCESS) next_csm = (PFN_vkCreateShaderModule)next_gdpa(*dev, "vkCreateShaderModule");
    return r;
}

VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL dump_GetDeviceProcAddr(VkDevice d, const char *name) {
    if (!strcmp(name, "vkCreateShaderModule")) return (PFN_vkVoidFunction)dump_CreateShaderModule;
    if (!strcmp(name, "vkGetDeviceProcAddr")) return (PFN_vkVoidFunction)dump_GetDeviceProcAddr;
    return next_gdpa(d, name);
}

VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL dump_GetInstanceProcAddr(VkInstance i, const char *name) {
    if (!strcmp(name, "vkCreateInstance")) return (PFN_vkVoidFunction)dump_CreateInstance;
    if (!strcmp(name, "vkCreateDevice")) return (PFN_vkVoidFunction)dump_CreateDevice;
    if (!strcmp(name, "vkGetDeviceProcAddr")) return (PFN_vkVoidFunction)dump_GetDeviceProcAddr;
    if (!strcmp(name, "vkCreateShaderModule")) return (PFN_vkVoidFunction)dump_CreateShaderModule;
    if (!strcmp(name, "vkGetInstanceProcAddr")) return (PFN_vkVoidFunction)dump_GetInstanceProcAddr;
    return next_gipa(i, name);
}
